#include <cstdint>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "kernels/key/digest.h"
#include "wire/wire.h"

namespace kiln::wire {
namespace {

void AppendSerialized(const google::protobuf::MessageLite& message, std::string* out) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  const uint64_t n = bytes.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(bytes);
}

}  // namespace

std::string RequestKey(const v1::Graph& graph, const v1::Target& target,
                       const v1::CompileOptions& options) {
  std::string bytes = "kiln-request-key-v1\n";
  for (const google::protobuf::MessageLite* m :
       {static_cast<const google::protobuf::MessageLite*>(&graph),
        static_cast<const google::protobuf::MessageLite*>(&target),
        static_cast<const google::protobuf::MessageLite*>(&options)}) {
    AppendSerialized(*m, &bytes);
  }
  return key::Sha256Hex(bytes);
}

}  // namespace kiln::wire
