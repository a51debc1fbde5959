// The family registry's entries, one descriptor per file (core/families/<name>.cpp); each reads its
// config through a struct of named fields in the order of its params. families() lists them in the order
// make_families() calls them here (tests and listings depend on it): a new family is one file and one line.
#pragma once
#include "core/family.hpp"

namespace flashtune {

Family make_naive();
Family make_fa1_simt();
Family make_fa2_simt();
Family make_fa2_simt_bwd();
Family make_fa2_mma();
Family make_fa2_mma_bwd();
Family make_fa2_wgmma_bwd();
Family make_fa3_wgmma();
Family make_fa3_wgmma_bwd();
Family make_decode_splitkv();
Family make_fault();  // test only

}  // namespace flashtune
