// kiln_health_probe: asks a kilnd's standard gRPC health service whether it serves, for
// container HEALTHCHECKs, systemd watchdogs and scripts.
//
//   kiln_health_probe HOST:PORT [SERVICE] [--timeout-s=3]
//
// Exits 0 when the answer is SERVING, 1 for NOT_SERVING (e.g. draining), 2 when no answer
// came (unreachable, timed out), 64 on bad usage. The grpc.health.v1 messages are two tiny
// protobufs, written and read here by hand so the probe needs no generated code: the request
// is field 1 (the service name, a string), the response field 1 (the status enum).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"

namespace {

constexpr int kServing = 1;  // grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING

grpc::ByteBuffer EncodeRequest(const std::string& service) {
  std::string bytes;
  if (!service.empty() && service.size() < 128) {
    bytes.push_back(0x0a);  // field 1, length-delimited
    bytes.push_back(static_cast<char>(service.size()));
    bytes += service;
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// The status enum of a HealthCheckResponse, or -1 when it is not there.
int DecodeStatus(const grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // Field 1 as a varint; every status fits in one byte. An absent field means 0 (UNKNOWN).
  if (bytes.empty()) return 0;
  if (bytes.size() >= 2 && bytes[0] == 0x08) return static_cast<unsigned char>(bytes[1]);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address, service;
  double timeout_s = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--timeout-s=", 0) == 0) {
      timeout_s = std::atof(arg.c_str() + 12);
    } else if (address.empty()) {
      address = arg;
    } else if (service.empty()) {
      service = arg;
    } else {
      address.clear();
      break;
    }
  }
  if (address.empty() || timeout_s <= 0) {
    std::fprintf(stderr, "usage: kiln_health_probe HOST:PORT [SERVICE] [--timeout-s=3]\n");
    return 64;
  }
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  const grpc::ByteBuffer request = EncodeRequest(service);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: no health answer: %s\n", address.c_str(),
                 status.error_message().c_str());
    return 2;
  }
  const int serving = DecodeStatus(response);
  std::printf("%s\n", serving == kServing ? "SERVING" : "NOT_SERVING");
  return serving == kServing ? 0 : 1;
}
