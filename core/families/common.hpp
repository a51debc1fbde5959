// What every family descriptor (core/families/*.cpp) builds its name expressions and launches from.
// Internal to the family registry: nothing outside core/family.cpp and core/families/ includes it.
#pragma once
#include <initializer_list>
#include <string>

#include "templates/traits_common.h"
#include "core/family.hpp"

namespace flashtune::family_parts {

const char* bool_arg(bool b);                                  // "true" / "false", as a template argument
std::string join_args(std::initializer_list<std::string> args);  // "a,b,c"
Launch make_launch(GridDims g, int threads, int smem, int cluster_x = 1);

}  // namespace flashtune::family_parts
