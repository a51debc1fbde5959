// Writes the synthetic fixture store (fixture.hpp) to argv[1], for the CLI-level tests.
#include <cstdio>

#include "fixture.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fixture_db OUT.db\n");
    return 2;
  }
  flashtune::Store s(argv[1]);
  flashtune::fixture::fill_fixture(s);
  flashtune::fixture::fill_experiments(s);
  return 0;
}
