// Kernel templates embedded in the binary at build time (cmake/embed_templates.cmake).
#pragma once
#include <string>
#include <vector>

namespace flashtune {

struct EmbeddedFile {
  std::string name;      // file name inside templates/, as #include'd
  std::string contents;
};

const std::vector<EmbeddedFile>& embedded_templates();

}  // namespace flashtune
