// Prints, for each engine string on stdin (one a line), "<text>\t<canonical or ERR>\t<cluster id or 0>", then for
// each LLMStatusCode value given as argv[i] "<code>\t<hixl status>": tests/cpp/test_cpp_hixl.py compares both with
// proto/datadist/hixl.py.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "hixl_wire.h"

int main(int argc, char **argv) {
  namespace w = datadist_cpp::hixl_wire;
  std::string line;
  while (std::getline(std::cin, line)) {
    w::Engine e;
    std::string why;
    if (w::ParseEngine(line, &e, &why)) {
      std::printf("%s\t%s\t%llu\n", line.c_str(), e.Canonical().c_str(),
                  static_cast<unsigned long long>(w::EngineClusterId(e)));
    } else {
      std::printf("%s\tERR\t0\n", line.c_str());
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::printf("%s\t%u\n", argv[i], w::HixlStatus(std::strtoll(argv[i], nullptr, 10)));
  }
  return 0;
}
