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

// The embedded templates as an NVRTC program's headers (nvrtcCreateProgram's two arrays; the pointers are into
// embedded_templates(), which lives as long as the process).
struct EmbeddedHeaders {
  std::vector<const char*> sources, names;
  int count() const { return static_cast<int>(sources.size()); }
};
inline EmbeddedHeaders embedded_headers() {
  EmbeddedHeaders h;
  for (const auto& f : embedded_templates()) {
    h.sources.push_back(f.contents.c_str());
    h.names.push_back(f.name.c_str());
  }
  return h;
}

}  // namespace flashtune
