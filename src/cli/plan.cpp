// `autosp plan`: which strategy trains the longest sequence on this many ranks of this much
// memory, from the compiler's own plans (train/planner.h).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "frontend/torch_import.h"
#include "models/llama.h"
#include "models/model.h"
#include "train/config.h"
#include "train/planner.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace autosp::cli {

namespace {

using nlohmann::json;
constexpr double kGiB = double(int64_t{1} << 30);

// "80GiB", "80 GB", "24G" (GiB), "1.5TiB", "512B". A bare number is refused: read as bytes,
// `--device-memory 80` planned for 80 bytes and reported that nothing fits.
int64_t parse_bytes(const std::string& text, const char* flag) {
  size_t end = 0;
  double v = 0;
  const std::string units_known = "B, KiB, MiB, GiB, TiB or KB, MB, GB, TB";
  try {
    v = std::stod(text, &end);
  } catch (const std::out_of_range&) {
    user_error(flag, " ", text, ": out of range (at most 8 EiB)");
  } catch (const std::exception&) {
    user_error(flag, " ", text, ": expected a size such as 80GiB, 80GB or 24G");
  }
  std::string unit = text.substr(end);
  unit.erase(std::remove_if(unit.begin(), unit.end(), ::isspace), unit.end());
  const std::string number = text.substr(0, end);
  if (unit.empty())
    user_error(flag, " ", text, ": a size needs a unit (", units_known, "), e.g. ", number, "GiB");
  const std::string unit_given = unit;
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {
      {"b", 1},        {"k", 1024.0},      {"kib", 1024.0},     {"kb", 1e3},   {"m", 1 << 20},
      {"mib", 1 << 20}, {"mb", 1e6},        {"g", kGiB},         {"gib", kGiB}, {"gb", 1e9},
      {"t", kGiB * 1024}, {"tib", kGiB * 1024}, {"tb", 1e12}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (!(v > 0)) user_error(flag, " ", text, ": expected a positive size such as 80GiB");
      // 2^63 bytes: the int64 byte counts the planner works in.
      if (!(v * scale < 9.2e18)) user_error(flag, " ", text, ": out of range (at most 8 EiB)");
      return int64_t(v * scale);
    }
  user_error(flag, " ", text, ": unknown unit '", unit_given, "' (", units_known, ")");
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", double(bytes) / kGiB);
  return buf;
}

std::string tokens(int64_t n) {
  if (n >= 1000000) return str(std::round(double(n) / 1e4) / 100, "M");
  if (n >= 1000) return str(std::round(double(n) / 1e2) / 10, "K");
  return std::to_string(n);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Peak memory per rank against S for every strategy (log S), with the device's line. Each
// series has its own colour (20 qualitative colours, chosen to stay visible on white; past
// 20 they repeat with another dash); tiled strategies are dashed and "auto" ones dotted on
// top, since each coincides with the strategy it picks. The canvas is sized to the legend,
// whose labels are measured at kCharWidth per character (a wide estimate for sans-serif).
std::string svg_plot(const std::vector<train::StrategyResult>& results, int64_t device, const std::string& title) {
  constexpr double kFont = 13, kCharWidth = 0.62 * kFont, kRow = 20, kSample = 30;
  static const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                        "#7f7f7f", "#bcbd22", "#17becf", "#000075", "#800000", "#3cb44b", "#f032e6",
                                        "#469990", "#9a6324", "#4363d8", "#e6194b", "#808000", "#000000"};
  std::vector<std::string> labels;
  size_t longest_label = 0;
  for (const auto& r : results) {
    labels.push_back(xml_escape(str(r.name, r.sp > 1 ? str(", SP ", r.sp) : ", no SP", ": ",
                                    r.max_seq_len ? tokens(r.max_seq_len) : "none fits")));
    longest_label = std::max(longest_label, labels.back().size());
  }
  const double L = 70, T = 44, B = 50, plot_w = 600, plot_h = 430, gap = 24, pad = 10;
  const double legend_x = L + plot_w + gap, legend_w = pad + kSample + 8 + double(longest_label) * kCharWidth + pad;
  const double legend_h = pad + kRow * double(results.size()) + pad;
  const double W = legend_x + legend_w + pad, H = std::max(T + plot_h + B, T + legend_h + pad);
  const double bottom = T + plot_h;  // the x axis

  // Up to 1.3 x the device memory, or further when nothing fits, so the lowest plan shows.
  double smin = 1e30, smax = 0, lowest = 1e30;
  for (const auto& r : results)
    for (auto [S, p] : r.samples)
      smin = std::min(smin, double(S)), smax = std::max(smax, double(S)), lowest = std::min(lowest, double(p));
  const double pmax = std::max(double(device) * 1.3, lowest * 1.1);
  if (smax <= smin) smax = smin * 2;
  auto x = [&](double S) { return L + (std::log2(S) - std::log2(smin)) / (std::log2(smax) - std::log2(smin)) * plot_w; };
  auto y = [&](double p) { return bottom - std::min(p, pmax) / pmax * plot_h; };
  std::string s = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", W, "\" height=\"", H, "\" viewBox=\"0 0 ", W,
                      " ", H, "\" font-family=\"sans-serif\" font-size=\"", kFont, "\">\n",
                      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"", L, "\" y=\"24\" font-size=\"",
                      kFont + 3, "\">", xml_escape(title), "</text>\n");
  // y grid every 1, 2 or 5 x 10^k GiB, at most 8 lines.
  const double gib_max = pmax / kGiB;
  double step = std::pow(10.0, std::floor(std::log10(gib_max / 8)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (gib_max / (step * m) <= 8) {
      step *= m;
      break;
    }
  for (double v = 0; v <= gib_max + 1e-9; v += step) {
    const double yy = y(v * kGiB);
    s += str("<line x1=\"", L, "\" y1=\"", yy, "\" x2=\"", L + plot_w, "\" y2=\"", yy, "\" stroke=\"#e0e0e0\"/>\n",
             "<text x=\"", L - 6, "\" y=\"", yy + 4, "\" text-anchor=\"end\">", v, "</text>\n");
  }
  for (double S = std::exp2(std::ceil(std::log2(smin))); S <= smax; S *= 2)
    s += str("<line x1=\"", x(S), "\" y1=\"", bottom, "\" x2=\"", x(S), "\" y2=\"", bottom + 4, "\" stroke=\"black\"/>\n",
             "<text x=\"", x(S), "\" y=\"", bottom + 18, "\" text-anchor=\"middle\" font-size=\"", kFont - 1, "\">",
             tokens(int64_t(S)), "</text>\n");
  s += str("<line x1=\"", L, "\" y1=\"", bottom, "\" x2=\"", L + plot_w, "\" y2=\"", bottom, "\" stroke=\"black\"/>\n",
           "<line x1=\"", L, "\" y1=\"", T, "\" x2=\"", L, "\" y2=\"", bottom, "\" stroke=\"black\"/>\n",
           "<text x=\"", L + plot_w / 2, "\" y=\"", bottom + 40, "\" text-anchor=\"middle\">sequence length S (tokens)</text>\n",
           "<text x=\"18\" y=\"", T + plot_h / 2, "\" transform=\"rotate(-90 18 ", T + plot_h / 2,
           ")\" text-anchor=\"middle\">planned peak per rank (GiB)</text>\n");
  s += str("<line x1=\"", L, "\" y1=\"", y(double(device)), "\" x2=\"", L + plot_w, "\" y2=\"", y(double(device)),
           "\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n<text x=\"", L + 6, "\" y=\"",
           y(double(device)) - 6, "\">device memory, ", gib(device), "</text>\n");
  auto stroke = [&](size_t i) {
    const auto& r = results[i];
    const bool repeat = i >= std::size(kColors);
    const char* dash = r.checkpoint == "auto" ? "2 4" : r.tiled != repeat ? "9 5" : "";
    return str("stroke=\"", kColors[i % std::size(kColors)], "\" stroke-width=\"", r.checkpoint == "auto" ? 3 : 2, "\"",
               *dash ? str(" stroke-dasharray=\"", dash, "\"") : "");
  };
  for (size_t i = 0; i < results.size(); ++i) {
    auto pts = results[i].samples;
    std::sort(pts.begin(), pts.end());
    std::string line;
    std::string marks;  // the plans made: a series of one plan is a dot
    for (auto [S, p] : pts) {
      line += str(x(double(S)), ",", y(double(p)), " ");
      marks += str("<circle cx=\"", x(double(S)), "\" cy=\"", y(double(p)), "\" r=\"2.5\" fill=\"",
                   kColors[i % std::size(kColors)], "\"/>\n");
    }
    s += str("<polyline class=\"series\" fill=\"none\" ", stroke(i), " points=\"", line, "\"/>\n", marks);
  }
  s += str("<rect class=\"legend\" x=\"", legend_x, "\" y=\"", T, "\" width=\"", legend_w, "\" height=\"", legend_h,
           "\" fill=\"white\" stroke=\"#bbbbbb\"/>\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const double row = T + pad + kRow * (double(i) + 0.5);
    s += str("<line class=\"legend-sample\" x1=\"", legend_x + pad, "\" y1=\"", row, "\" x2=\"", legend_x + pad + kSample,
             "\" y2=\"", row, "\" ", stroke(i), "/>\n<text class=\"legend-label\" x=\"", legend_x + pad + kSample + 8,
             "\" y=\"", row + kFont * 0.35, "\" data-width=\"", double(labels[i].size()) * kCharWidth, "\">",
             labels[i], "</text>\n");
  }
  return s + "</svg>\n";
}

}  // namespace

int run_plan(const PlanArgs& args) {
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  const bool pt2 = fs::path(args.model).extension() == ".pt2";
  const std::string config = fs::is_directory(args.model) ? args.model + "/config.json" : args.model;
  train::PlanSetup setup;
  std::optional<TorchProgram> imported;  // --model FILE.pt2: a PyTorch program (frontend/torch_import.h)
  if (pt2) {
    imported.emplace(TorchProgram::load(args.model));
    // (the searches run on threads of their own; the program is imported by one at a time)
    auto lock = std::make_shared<std::mutex>();
    models::Model program = imported->model();
    program.forward = [forward = program.forward, lock](const models::LlamaTraceOptions& o) {
      std::lock_guard<std::mutex> hold(*lock);
      return forward(o);
    };
    setup.program = std::make_shared<const models::Model>(std::move(program));
  } else {
    std::vector<std::string> warnings;  // config.json's keys autosp does not read, said once
    setup.model = models::load_llama_config(config, &warnings);
    for (const std::string& w : warnings) std::fprintf(stderr, "autosp: warning: %s\n", w.c_str());
  }
  setup.world = static_cast<int>(args.world);
  setup.sp = static_cast<int>(args.sp);
  setup.zero = static_cast<int>(args.zero);
  setup.micro_batch = args.micro_batch;
  setup.accumulation_steps = args.accumulation;
  if (args.dtype == "bf16") setup.dtype = DType::bf16;
  else if (args.dtype == "f32") setup.dtype = DType::f32;
  else user_error("--dtype ", args.dtype, ": expected bf16 or f32");
  if (!args.backend.empty()) setup.backend = parse_backend(args.backend);
  if (train::plan_backend(setup) == Backend::cpu && setup.dtype == DType::bf16)
    user_error("--backend cpu --dtype bf16: the CPU kernels are fp32; plan bf16 for --backend cuda, or the CPU "
               "runtime with --dtype f32");
  if (args.world % args.sp != 0)
    user_error("--world ", args.world, " is not divisible by --sp ", args.sp, " (world = data parallel x sequence parallel)");
  const int64_t device = parse_bytes(args.device_memory, "--device-memory");
  int64_t N = 0;
  if (pt2) {
    // A program is checked by planning it once at the shortest length the searches try: an SP
    // size its heads cannot take, or any other refusal, is the error it gives there.
    for (const models::ParameterSpec& p : setup.program->parameters) N += numel(p.shape);
    try {
      train::plan_step(setup, {}, 1024 * setup.sp);
    } catch (const UserError& e) {
      user_error("--model ", args.model, " at --sp ", args.sp, ", S = ", 1024 * setup.sp, " (the shortest length "
                 "planned): ", e.what());
    }
  } else {
    train::check_heads_layout(setup.model, args.sp, str("--sp ", args.sp), config);
    N = models::llama_num_parameters(setup.model);
  }

  // Strategies: no SP (pure data parallelism over the same ranks, ZeRO as given) and SP;
  // each checkpoint policy, without and with MLP tiles sized from the device memory.
  using P = CheckpointPolicy;
  // Each strategy's search compiles on its own thread (compiling is single-threaded and
  // shares nothing but read-only op tables).
  train::PlanCache cache;  // tiles that change nothing at S plan as no tiles; the breakdown below
  std::vector<std::future<train::StrategyResult>> searches;
  for (int sp : {1, setup.sp}) {
    train::PlanSetup s = setup;
    s.sp = sp;
    const int64_t granularity = 1024 * sp;
    for (bool tiled : {false, true})
      for (P policy : {P::none, P::sac, P::full}) {
        const TileOptions tiles = !tiled ? TileOptions{} : args.tile_rows > 0 ? TileOptions{.tile_rows = args.tile_rows}
                                                                              : TileOptions{.budget_bytes = device};
        const train::MemoryStrategy strategy{{policy}, tiles};
        searches.push_back(std::async(std::launch::async, [s, strategy, device, granularity, &cache] {
          return train::longest_sequence(s, strategy, device, granularity, &cache);
        }));
      }
    if (setup.sp == 1) break;
  }
  std::vector<train::StrategyResult> results;
  for (auto& search : searches) results.push_back(search.get());
  // auto: the cheapest policy that fits, so its longest sequence is the longest of any.
  std::vector<train::StrategyResult> autos;
  for (int sp : {1, setup.sp}) {
    for (bool tiled : {false, true}) {
      const train::StrategyResult* best = nullptr;
      for (const auto& r : results)
        if (r.sp == sp && r.tiled == tiled && (!best || r.max_seq_len > best->max_seq_len)) best = &r;
      if (!best) continue;
      train::StrategyResult a = *best;
      a.name = str("auto (", best->name, ")");
      a.checkpoint = "auto";
      autos.push_back(a);
    }
    if (setup.sp == 1) break;
  }
  results.insert(results.end(), autos.begin(), autos.end());
  const auto best = std::max_element(results.begin(), results.end(),
                                     [](const auto& a, const auto& b) { return a.max_seq_len < b.max_seq_len; });
  train::PlanSetup best_setup = setup;
  best_setup.sp = best->sp;
  const train::MemoryBreakdown b =
      cache.plan(best_setup, best->strategy, std::max<int64_t>(best->max_seq_len, 1024 * best->sp));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const train::ArenaParts& a = b.arena_parts;
  const json breakdown = {{"seq_len", std::max<int64_t>(best->max_seq_len, 1024 * best->sp)},
                          {"strategy", best->name},
                          {"parameters", b.parameters},
                          {"gradient_sum", b.gradient_sum},
                          {"optimizer_state", b.optimizer_state},
                          {"arena", b.arena},
                          {"arena_parts", {{"gradient_buckets", a.gradient_buckets},
                                           {"gathered_parameters", a.gathered_parameters},
                                           {"activations", a.activations},
                                           {"activation_gradients", a.activation_gradients},
                                           {"workspaces", a.workspaces},
                                           {"fragmentation", a.fragmentation}}},
                          {"communication", b.communication},
                          {"runtime_reserve", b.runtime_reserve},
                          {"total", b.total()}};
  if (args.json) {
    json strategies = json::array();
    for (const auto& r : results)
      strategies.push_back({{"name", r.name}, {"sp", r.sp}, {"zero", r.zero}, {"checkpoint", r.checkpoint},
                            {"tiled", r.tiled}, {"max_seq_len", r.max_seq_len}, {"peak_bytes", r.peak_bytes},
                            {"refused", r.refused}});
    std::cout << json{{"model", config},
                      {"parameters", N},
                      {"world", setup.world},
                      {"sp", setup.sp},
                      {"zero", setup.zero},
                      {"dtype", args.dtype},
                      {"backend", backend_name(train::plan_backend(setup))},
                      {"precision", train::describe_precision(setup)},
                      {"micro_batch", setup.micro_batch},
                      {"gradient_accumulation_steps", setup.accumulation_steps},
                      {"device_memory_bytes", device},
                      {"strategies", strategies},
                      {"breakdown", breakdown},
                      {"seconds", seconds}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("autosp plan: %s, %.2fB parameters; %d ranks (data parallel %d x sequence parallel %d), ZeRO-%d, "
                "micro batch %lld%s, %s per rank\n%s: %s\n\n",
                config.c_str(), double(N) / 1e9, setup.world, setup.world / setup.sp, setup.sp, setup.zero,
                (long long)setup.micro_batch,
                setup.accumulation_steps > 1 ? str(" x ", setup.accumulation_steps, " accumulated").c_str() : "",
                gib(device).c_str(), args.dtype.c_str(),
                train::describe_precision(setup).c_str());
    std::printf("| strategy | SP | ZeRO | checkpoint | tiled | longest S | planned peak per rank |\n"
                "|---|---:|---:|---|---|---:|---:|\n");
    for (const auto& r : results)
      std::printf("| %s | %d | %d | %s | %s | %s | %s |\n", r.sp > 1 ? "SP" : "no SP", r.sp, r.zero,
                  r.checkpoint.c_str(), r.tiled ? "yes" : "no", r.max_seq_len ? tokens(r.max_seq_len).c_str() : "none fits",
                  r.max_seq_len ? gib(r.peak_bytes).c_str() : "—");
    // A program's refusals of longer sequences, each said once.
    std::vector<std::string> refusals;
    for (const auto& r : results)
      if (!r.refused.empty() && std::find(refusals.begin(), refusals.end(), r.refused) == refusals.end())
        refusals.push_back(r.refused);
    for (const std::string& why : refusals) std::printf("\nthe program refuses a longer sequence: %s\n", why.c_str());
    std::printf("\nper rank at S = %s with %s%s:\n", tokens(breakdown["seq_len"]).c_str(), best->name.c_str(),
                best->sp > 1 ? str(", SP ", best->sp).c_str() : "");
    auto line = [](const char* what, int64_t bytes) { std::printf("  %-40s %12s\n", what, gib(bytes).c_str()); };
    line("parameters", b.parameters);
    line(setup.accumulation_steps > 1 ? "gradient sum (between micro batches)" : "gradient sum (no accumulation)",
         b.gradient_sum);
    line("optimizer state", b.optimizer_state);
    line("arena, at its peak", b.arena);
    line("  gradient buckets", a.gradient_buckets);
    line("  gathered parameters (ZeRO-3)", a.gathered_parameters);
    line("  activations (forward and recomputed)", a.activations);
    line("  activation gradients", a.activation_gradients);
    line("  kernel workspaces", a.workspaces);
    line("  fragmentation (unused gaps)", a.fragmentation);
    line("communication scratch (ZeRO-1/2)", b.communication);
    line("runtime reserve", b.runtime_reserve);
    std::printf("  %-40s %12s of %s\n(planned in %.1f s)\n", "total", gib(b.total()).c_str(), gib(device).c_str(), seconds);
  }
  if (!args.plot.empty())
    write_file_atomic(args.plot, svg_plot(results, device, str(fs::path(config).filename().string(), ": planned peak per rank, ",
                                                               setup.world, " ranks, ZeRO-", setup.zero, ", ", args.dtype)));
  return 0;
}

}  // namespace autosp::cli
