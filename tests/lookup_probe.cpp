// The runtime's config lookup in a process of its own, for hostile_inputs.sh: reads $FLASHTUNE_DB (else the
// user's store) as a call does (store_for, choose_with_store over the compiled tables) and prints
// "family config source", or the call's one-line error on stderr with exit 2.
//   lookup_probe DEVICE ARCH fwd|bwd DTYPE HEAD_DIM CAUSAL(0|1) SEQ [PAGE_SIZE]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "lookup.hpp"
#include "user_store.hpp"

using namespace flashtune;
using namespace flashtune::rt;

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::fprintf(stderr, "usage: lookup_probe DEVICE ARCH fwd|bwd DTYPE HEAD_DIM CAUSAL SEQ [PAGE_SIZE]\n");
    return 2;
  }
  try {
    Query q;
    q.device = argv[1];
    q.arch = argv[2];
    q.direction = argv[3];
    q.dtype = parse_dtype(argv[4]);
    q.head_dim = std::atoi(argv[5]);
    q.causal = std::atoi(argv[6]) != 0;
    q.seq = q.seq_q = std::atoi(argv[7]);
    if (argc == 9) q.page_size = std::atoi(argv[8]);
    const Pick p = choose_with_store(generated_tables(), q, store_for(q.device));
    if (!p.family) {
      std::fprintf(stderr, "no family runs this query\n");
      return 2;
    }
    std::printf("%s %s %s%s%s\n", p.family->name.c_str(), p.family->config_string(p.config).c_str(), p.source.c_str(),
                p.note.empty() ? "" : " note: ", p.note.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FLASHTUNE_DB: %s\n", e.what());
    return 2;
  }
  return 0;
}
