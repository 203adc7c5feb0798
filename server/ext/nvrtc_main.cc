// kiln-nvrtc: compiles one CUDA source with NVRTC into a cubin. kilnd runs it inside the build
// sandbox (server/ext/sandbox.h) for raw kernels, so NVRTC never reads the server's files.
//
//   kiln-nvrtc IN OUT sm_XX NAME [NVRTC options...]
//
// Writes the cubin to OUT and the lowered (mangled) name of NAME to OUT.name; prints NVRTC's
// log. Exit 0 on success, 1 when the source does not compile, 2 on a usage or I/O error.
//   kiln-nvrtc --version   prints NVRTC's version.
#include <nvrtc.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--version") {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    std::printf("nvrtc %d.%d\n", major, minor);
    return 0;
  }
  if (argc < 5) {
    std::fprintf(stderr, "usage: kiln-nvrtc IN OUT sm_XX NAME [options...]\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) return 2;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string source = ss.str();
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, source.c_str(), "kernel.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS)
    return 2;
  nvrtcAddNameExpression(prog, argv[4]);
  std::vector<std::string> options = {std::string("--gpu-architecture=") + argv[3]};
  for (int i = 5; i < argc; ++i) options.emplace_back(argv[i]);
  std::vector<const char*> opts;
  for (const std::string& o : options) opts.push_back(o.c_str());
  nvrtcResult rc = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 0) nvrtcGetProgramLog(prog, log.data());
  std::fputs(log.c_str(), stdout);
  if (rc != NVRTC_SUCCESS) {
    std::printf("%s\n", nvrtcGetErrorString(rc));
    return 1;
  }
  const char* lowered = nullptr;
  if (nvrtcGetLoweredName(prog, argv[4], &lowered) != NVRTC_SUCCESS || lowered == nullptr) {
    std::printf("'%s' is not a __global__ function of the source\n", argv[4]);
    return 1;
  }
  size_t size = 0;
  if (nvrtcGetCUBINSize(prog, &size) != NVRTC_SUCCESS) return 2;
  std::string cubin(size, '\0');
  nvrtcGetCUBIN(prog, cubin.data());
  std::ofstream out(argv[2], std::ios::binary);
  out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  std::ofstream name(std::string(argv[2]) + ".name");
  name << lowered << "\n";
  return out && name ? 0 : 2;
}
