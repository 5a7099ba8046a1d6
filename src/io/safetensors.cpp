#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>

#include "io/file.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace autosp::io {

// Tensor bytes are copied straight into and out of host floats.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

size_t item_size(FileDType d) { return d == FileDType::F32 ? 4 : 2; }
const char* dtype_name(FileDType d) {
  return d == FileDType::F32 ? "F32" : d == FileDType::BF16 ? "BF16" : "F16";
}

namespace {

using json = nlohmann::json;

// Hugging Face's loader refuses headers above this size; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Root object, tensor entry, shape array: 3 levels; a little slack for metadata writers.
constexpr int kMaxHeaderDepth = 8;

using DType = FileDType;

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t numel;
  uint64_t begin, end;  // in the data buffer
};


// A JSON integer as a non-negative int64, or nullopt (negative, too big, not an integer).
std::optional<int64_t> non_negative_int(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

std::string json_text(const json& v) {
  // Error messages quote user JSON; invalid UTF-8 is already rejected by the parser.
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

Entry parse_entry(const std::string& path, const std::string& name, const json& v,
                  uint64_t buffer_bytes) {
  const std::string where = str(path, ": tensor '", name, "': ");
  if (!v.is_object()) user_error(where, "header entry is not a JSON object but ", json_text(v));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) user_error(where, "header entry has no \"", key, "\"");

  Entry e;
  e.name = name;
  const json& dtype = v["dtype"];
  if (!dtype.is_string()) user_error(where, "\"dtype\" is not a string but ", json_text(dtype));
  const std::string& d = dtype.get_ref<const std::string&>();
  if (d == "F32")
    e.dtype = DType::F32;
  else if (d == "BF16")
    e.dtype = DType::BF16;
  else if (d == "F16")
    e.dtype = DType::F16;
  else
    user_error(where, "has dtype ", json_text(dtype), "; autosp reads only F32, BF16 and F16");

  const json& shape = v["shape"];
  if (!shape.is_array()) user_error(where, "\"shape\" is not an array but ", json_text(shape));
  e.numel = 1;
  for (const json& dim : shape) {
    std::optional<int64_t> n = non_negative_int(dim);
    if (!n)
      user_error(where, "\"shape\" ", json_text(shape),
                 " has a dimension that is not a non-negative 64-bit integer");
    e.shape.push_back(*n);
    if (__builtin_mul_overflow(e.numel, *n, &e.numel))
      user_error(where, "shape ", json_text(shape), " has more elements than fit in 64 bits");
  }
  int64_t need_bytes;
  if (__builtin_mul_overflow(e.numel, static_cast<int64_t>(item_size(e.dtype)), &need_bytes))
    user_error(where, "shape ", json_text(shape), " needs more bytes than fit in 64 bits");

  const json& offsets = v["data_offsets"];
  std::optional<int64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = non_negative_int(offsets[0]);
    end = non_negative_int(offsets[1]);
  }
  if (!begin || !end)
    user_error(where, "\"data_offsets\" is not [begin, end] of non-negative integers but ",
               json_text(offsets));
  if (*begin > *end) user_error(where, "data_offsets ", json_text(offsets), " has begin after end");
  if (static_cast<uint64_t>(*end) > buffer_bytes)
    user_error(where, "data_offsets ", json_text(offsets), " ends beyond the ", buffer_bytes,
               "-byte data buffer (file truncated?)");
  if (*end - *begin != need_bytes)
    user_error(where, "data_offsets ", json_text(offsets), " span ", *end - *begin,
               " bytes but dtype ", dtype_name(e.dtype), " and shape ", shape_string(e.shape),
               " need ", need_bytes);
  e.begin = static_cast<uint64_t>(*begin);
  e.end = static_cast<uint64_t>(*end);
  return e;
}

void parse_metadata(const std::string& path, const json& v,
                    std::map<std::string, std::string>* metadata) {
  if (!v.is_object())
    user_error(path, ": \"__metadata__\" is not a JSON object but ", json_text(v));
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      user_error(path, ": \"__metadata__\" key '", key, "' is not a string but ", json_text(value));
    if (metadata) (*metadata)[key] = value.get<std::string>();
  }
}

// Converts `numel` elements of 16-bit `dtype` at buffer offset `at` in bounded chunks, so
// a large tensor never needs a second full-size copy.
void read_16bit(const ReadOnlyFile& file, uint64_t at, DType dtype, float* out, int64_t numel) {
  constexpr int64_t kChunk = 1 << 20;
  std::vector<uint16_t> raw(static_cast<size_t>(std::min(numel, kChunk)));
  for (int64_t done = 0; done < numel;) {
    int64_t n = std::min(numel - done, kChunk);
    file.read(at + static_cast<uint64_t>(done) * 2, raw.data(), static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i)
      out[done + i] = dtype == DType::BF16 ? bf16_to_float(raw[i]) : f16_to_float(raw[i]);
    done += n;
  }
}

}  // namespace

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

float f16_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f)  // inf (mant == 0) or NaN, payload kept in the top mantissa bits
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp != 0)  // normal: rebias 15 -> 127
    return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
  // zero or subnormal: mant * 2^-24, exact in fp32
  float magnitude = std::ldexp(static_cast<float>(mant), -24);
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN, quieted
  // Adding 0x7fff rounds the dropped half up when it is above one half; the kept LSB adds
  // the last 1 on an exact half (ties to even). A carry into the exponent is the correct
  // rounding (to the next binade, or to inf).
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

uint16_t float_to_f16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN, quieted
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below 2^-14: an f16 subnormal (or zero), in units of 2^-24
    // |x| * 2^24 rounded to an integer, to nearest even: exact in fp32 arithmetic, since
    // the scaling is by a power of two and rint rounds once.
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias 127 -> 15 and drop 13 mantissa bits, to nearest even; a carry into the
  // exponent is again the correct rounding.
  const uint32_t rebiased = abs - (112u << 23);
  return static_cast<uint16_t>(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct SafetensorsReader::Impl {
  explicit Impl(const std::string& p) : path(p), file(p) {}
  std::string path;
  ReadOnlyFile file;
  std::map<std::string, std::string> metadata;
  std::map<std::string, Entry> entries;
  std::vector<const Entry*> by_offset;  // entries in data order
  uint64_t data_start = 0;
};

SafetensorsReader::SafetensorsReader(const std::string& path) : impl_(std::make_unique<Impl>(path)) {
  const ReadOnlyFile& file = impl_->file;
  std::map<std::string, std::string>* metadata = &impl_->metadata;
  if (file.size() < 8)
    user_error(path, ": file is ", file.size(),
               " bytes, too short for the 8-byte header length of a safetensors file");
  unsigned char len_bytes[8];
  file.read(0, len_bytes, 8);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | len_bytes[i];
  if (header_bytes < 2)
    user_error(path, ": header length ", header_bytes, " is too small for a JSON object");
  if (header_bytes > kMaxHeaderBytes)
    user_error(path, ": header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes,
               " bytes (not a safetensors file?)");
  if (header_bytes > file.size() - 8)
    user_error(path, ": header length ", header_bytes, " exceeds the ", file.size() - 8,
               " bytes after the length field (file truncated?)");
  std::string header(header_bytes, '\0');
  file.read(8, header.data(), header.size());
  if (header[0] != '{')
    user_error(path, ": header does not start with '{' (not a safetensors file?)");

  // The parser keeps only the last of duplicate keys; a duplicated tensor name would
  // silently drop a tensor, so top-level keys are collected as they are parsed. Nesting
  // is capped because json's dump (used in messages) recurses: a header of a million
  // '[' would otherwise overflow the stack. A valid header nests containers 3 deep.
  std::set<std::string> seen;
  std::string duplicate;
  json root;
  try {
    root = json::parse(header, [&](int depth, json::parse_event_t event, json& parsed) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth >= kMaxHeaderDepth)
        user_error(path, ": header nests JSON objects or arrays more than ", kMaxHeaderDepth,
                   " deep, which no safetensors header does");
      if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
        std::string key = parsed.get<std::string>();
        if (!seen.insert(key).second) duplicate = key;
      }
      return true;
    });
  } catch (const json::exception& e) {
    user_error(path, ": header is not valid JSON: ", e.what());
  }
  if (!root.is_object()) user_error(path, ": header is not a JSON object");
  if (!duplicate.empty())
    user_error(path, ": tensor '", duplicate, "' appears twice in the header");

  const uint64_t data_start = 8 + header_bytes;
  const uint64_t buffer_bytes = file.size() - data_start;
  std::vector<Entry> entries;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__")
      parse_metadata(path, value, metadata);
    else
      entries.push_back(parse_entry(path, name, value, buffer_bytes));
  }

  // The tensors must tile the buffer exactly, as Hugging Face requires: sorted by
  // offset, each starts where the previous ended, the last ends at the end of the file.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      user_error(path, ": tensor '", e.name, "' (bytes [", e.begin, ", ", e.end,
                 ")) overlaps tensor '", previous->name, "' (bytes [", previous->begin, ", ",
                 previous->end, "))");
    if (e.begin > covered)
      user_error(path, ": tensor '", e.name, "' starts at byte ", e.begin,
                 " of the data buffer, leaving a gap of bytes [", covered, ", ", e.begin,
                 ") that belong to no tensor");
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_bytes)
    user_error(path, ": data buffer is ", buffer_bytes, " bytes but the tensors cover only ",
               covered, " (trailing bytes after ",
               previous ? "tensor '" + previous->name + "'" : std::string("the header"), ")");

  impl_->data_start = data_start;
  for (Entry& e : entries) impl_->entries.emplace(e.name, std::move(e));
  for (const auto& [name, e] : impl_->entries) impl_->by_offset.push_back(&e);
  std::sort(impl_->by_offset.begin(), impl_->by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::string& SafetensorsReader::path() const { return impl_->path; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return impl_->metadata; }

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : impl_->entries) names.push_back(name);
  return names;
}

void SafetensorsReader::expect(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) user_error(impl_->path, ": missing tensor '", name, "'");
  if (it->second.shape != shape)
    user_error(impl_->path, ": tensor '", name, "' has shape ", shape_string(it->second.shape), ", expected ",
               shape_string(shape));
}

void SafetensorsReader::read(const std::string& name, int64_t begin, int64_t n, float* out) const {
  auto it = impl_->entries.find(name);
  AUTOSP_CHECK(it != impl_->entries.end(), impl_->path, ": no tensor ", name);
  const Entry& e = it->second;
  AUTOSP_CHECK(begin >= 0 && n >= 0 && begin + n <= e.numel, name, ": elements [", begin, ", ", begin + n, ") of ",
               e.numel);
  if (n == 0) return;
  const uint64_t at = impl_->data_start + e.begin + static_cast<uint64_t>(begin) * item_size(e.dtype);
  if (e.dtype == DType::F32)
    impl_->file.read(at, out, static_cast<size_t>(n) * sizeof(float));
  else
    read_16bit(impl_->file, at, e.dtype, out, n);
}

FileDType SafetensorsReader::dtype(const std::string& name) const {
  auto it = impl_->entries.find(name);
  AUTOSP_CHECK(it != impl_->entries.end(), impl_->path, ": no tensor ", name);
  return it->second.dtype;
}

bool SafetensorsReader::contains(const std::string& name) const { return impl_->entries.count(name) > 0; }

std::map<std::string, HostTensor> read_safetensors(const std::string& path,
                                                   std::map<std::string, std::string>* metadata) {
  SafetensorsReader reader(path);
  if (metadata) *metadata = reader.metadata();
  std::map<std::string, HostTensor> tensors;
  for (const Entry* e : reader.impl_->by_offset) {
    HostTensor& t = tensors[e->name];
    t.shape = e->shape;
    t.data.resize(static_cast<size_t>(e->numel));
    reader.read(e->name, 0, e->numel, t.data.data());
  }
  return tensors;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, shape, dtype] : tensors) {
    AUTOSP_CHECK(name != "__metadata__", "a tensor cannot be named __metadata__");
    AUTOSP_CHECK(!header.contains(name), "tensor '", name, "' is written twice");
    int64_t numel = 1;
    for (int64_t d : shape) {
      AUTOSP_CHECK(d >= 0, "tensor '", name, "' has shape ", shape_string(shape));
      numel *= d;
    }
    const uint64_t bytes = static_cast<uint64_t>(numel) * item_size(dtype);
    header[name] = {{"dtype", dtype_name(dtype)}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    numel_.push_back(numel);
    dtype_.push_back(dtype);
    offset_.push_back(offset);
    offset += bytes;
  }
  data_bytes_ = offset;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    user_error("cannot write '", path, "': a tensor name or metadata string is not valid UTF-8: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  data_start_ = 8 + text.size();
  for (uint64_t& o : offset_) o += data_start_;
  file_ = std::make_unique<AtomicFileWriter>(path);
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>(text.size() >> (8 * i) & 0xff);
  file_->append({len_bytes, 8});
  file_->append(text);
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(size_t index, int64_t begin, const float* data, int64_t n) {
  AUTOSP_CHECK(index < numel_.size() && begin >= 0 && n >= 0 && begin + n <= numel_[index], "tensor ", index,
               ": elements [", begin, ", ", begin + n, ")");
  const FileDType dtype = dtype_[index];
  const uint64_t at = offset_[index] + static_cast<uint64_t>(begin) * item_size(dtype);
  if (dtype == FileDType::F32) {
    file_->write_at(at, {reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(float)});
  } else {  // narrowed in bounded chunks, as read_16bit widens
    constexpr int64_t kChunk = 1 << 14;
    uint16_t narrow[kChunk];
    for (int64_t done = 0; done < n;) {
      const int64_t m = std::min(kChunk, n - done);
      for (int64_t i = 0; i < m; ++i)
        narrow[i] = dtype == FileDType::BF16 ? float_to_bf16(data[done + i]) : float_to_f16(data[done + i]);
      file_->write_at(at + static_cast<uint64_t>(done) * 2, {reinterpret_cast<const char*>(narrow), size_t(m) * 2});
      done += m;
    }
  }
  written_ += static_cast<uint64_t>(n) * item_size(dtype);
}

void SafetensorsWriter::commit() {
  AUTOSP_CHECK(written_ == data_bytes_, file_->path(), ": ", written_, " data bytes written of ", data_bytes_);
  file_->commit();
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorToWrite> shapes;
  for (const auto& [name, t] : tensors) {
    AUTOSP_CHECK(t != nullptr, "tensor '", name, "' is null");
    int64_t numel = 1;
    for (int64_t d : t->shape) numel *= d;
    AUTOSP_CHECK(static_cast<size_t>(numel) == t->data.size(), "tensor '", name, "' has shape ",
                 shape_string(t->shape), " but ", t->data.size(), " values");
    shapes.push_back({name, t->shape, FileDType::F32});
  }
  SafetensorsWriter writer(path, shapes, metadata);
  for (size_t i = 0; i < tensors.size(); ++i)
    writer.write(i, 0, tensors[i].second->data.data(), static_cast<int64_t>(tensors[i].second->data.size()));
  writer.commit();
}

const HostTensor& expect_tensor(const std::map<std::string, HostTensor>& tensors,
                                const std::string& name, const std::vector<int64_t>& shape,
                                const std::string& file) {
  auto it = tensors.find(name);
  if (it == tensors.end()) user_error(file, ": missing tensor '", name, "'");
  if (it->second.shape != shape)
    user_error(file, ": tensor '", name, "' has shape ", shape_string(it->second.shape),
               ", expected ", shape_string(shape));
  return it->second;
}

}  // namespace autosp::io
