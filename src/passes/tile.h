// tile: row-wise subgraphs run over tiles of the sequence, so their wide intermediates (the
// MLP's [rows, F] gate, up and swiglu values) never exist for the whole sequence, neither in
// forward nor, with the checkpoint pass, in backward. ALST's TiledMLP, as a compiler choice.
//
// Runs on the forward graph, after autosp and before autodiff. Autodiff then makes each
// tile's backward from the gradient rules of slice and concat (nothing new to differentiate),
// and parameter gradients come out as sums over tiles. Backward would still keep every
// tile's saved values, i.e. all of [S, F] again; so the checkpoint pass (checkpoint.h)
// recomputes every saved value of a tiled node, under every policy, just before that tile's
// backward: one tile's intermediates are alive at a time.
//
// The regions tiled: each MLP block of the Llama family, found by its structure (not by
// names):
//   h, rstd = rms_norm(x, w);  g = linear(h, Wg);  u = linear(h, Wu);  a = swiglu(g, u);
//   d = linear(a, Wd);  y = add(x, d)   (the residual add: in the region when it adds x)
// where x is [B, S, H] with the sequence at dim 1 (under autosp: this rank's S_local rows),
// the weights are graph inputs, and every value but the region's result is used only inside
// the region (rstd by nothing: only the gradient rule of rms_norm reads it).
//
// Invariants kept:
//  - Every node outside the tiled regions is unchanged (op, attributes, result types,
//    shardings, names), and so are the graph inputs and outputs, in the same order.
//  - A region tiled T ways with R rows per tile becomes, for t = 0 .. T-1:
//      x_t = slice(x) {dim=1, start=t R, end=min((t + 1) R, S)},  the region's nodes on x_t,
//    then one concat {dim=1} of the T results in tile order, which stands for the region's
//    result. The tiles cover rows [0, S) exactly once, in order; the last tile has the
//    S - (T - 1) R rows that are left when R does not divide S.
//  - Every node of tile t, the slice included, carries the attribute `tile = t`
//    (kTileAttribute). Shape rules and kernels ignore it; the checkpoint pass reads it.
//  - Each tiled value keeps the sharding of the value it is a tile of: under autosp a tile
//    of this rank's @shard(1) rows is @shard(1) (this rank's rows of the tile), so the
//    annotations keep meaning what autosp's rules made them mean.
//  - Numbers: row-wise ops compute a row from that row alone, so forward values are the
//    untiled ones wherever the kernels' per-row results do not depend on how many rows they
//    are given (tests/passes/tile_test.cpp measures it); parameter gradients become sums over
//    tiles, which reorders fp32 sums.
//  - A region of S <= R rows is left as it is; no tiling (tile_rows 0, no budget) returns
//    the graph unchanged.
#pragma once
#include <cstdint>

#include "ir/graph.h"

namespace autosp {

inline constexpr const char* kTileAttribute = "tile";

// How many rows of the sequence each tile has.
//  - tile_rows > 0 forces R = tile_rows (compile.tile_rows).
//  - Else, with budget_bytes > 0, R is chosen so that one tile's region values (all results
//    of the region's nodes for R rows, in bytes) fit in budget_fraction x budget_bytes, with
//    the fewest tiles: T = ceil(S x bytes_per_row / (budget_fraction x budget_bytes)),
//    R = ceil(S / T), never fewer than min_rows rows (gemms over few rows run slowly, and
//    ALST's default of about H rows per tile is of that order). T = 1 is no tiling.
//  - Else no tiling.
// One tile of the MLP holds about 3 [R, F] values (gate, up, swiglu) in forward and about 6
// in its backward (their recomputed copies and gradients), so the fraction bounds what
// tiling adds to the rest of the step's activations.
struct TileOptions {
  int64_t tile_rows = 0;
  int64_t budget_bytes = 0;
  double budget_fraction = 1.0 / 16;
  int64_t min_rows = 64;
};

// R for a region of S rows whose values take bytes_per_row bytes per row of the sequence;
// S when it is not tiled.
int64_t choose_tile_rows(int64_t S, int64_t bytes_per_row, const TileOptions& options);

Graph tile(const Graph& forward, const TileOptions& options);

}  // namespace autosp
