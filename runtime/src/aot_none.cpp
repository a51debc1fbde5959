// The AOT table of a build without FLASHTUNE_AOT_ARCHS: empty, every kernel is JIT-compiled.
#include "aot.hpp"

namespace flashtune::rt {
AotTable aot_table() { return {}; }
}  // namespace flashtune::rt
