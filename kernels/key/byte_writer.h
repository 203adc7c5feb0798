// The little-endian record writer behind kiln's canonical encodings: the action key's graph
// bytes (key.cc), the bytes a result's signature covers (wire/result_bytes.cc) and the request
// key (wire/serialized_request_key.cc). Integers are 8 bytes little-endian two's complement on
// every host, doubles their IEEE-754 bits as such an integer (-0.0 and NaN payloads kept),
// strings their length then their bytes, lists their length then their items, so
// records written on different machines hash alike. Header-only with no dependency: the client
// core compiles it with the rest of wire/.
// Thread-safety: a value type; one writer per thread.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::key {

class ByteWriter {
 public:
  void Byte(char c) { out_.push_back(c); }
  void Int(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void Str(std::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    out_.append(s);
  }
  void Ints(const std::vector<int64_t>& list) {
    Int(static_cast<int64_t>(list.size()));
    for (int64_t v : list) Int(v);
  }
  void Double(double v) { Int(std::bit_cast<int64_t>(v)); }
  void Doubles(const std::vector<double>& list) {
    Int(static_cast<int64_t>(list.size()));
    for (double v : list) Double(v);
  }
  // Bytes as they are, no length: a fixed label or a value whose length the format fixes.
  void Raw(std::string_view s) { out_.append(s); }
  void Reserve(size_t n) { out_.reserve(n); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace kiln::key
