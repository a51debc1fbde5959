// The T4 auto-tuning results format (Kernel Tuner, KTT; JSON schema 1.0.0, a copy with its source in
// tests/data/t4/): `flashtune export --format t4` and `flashtune import`.
//
// One T4 result per stored result row:
//   configuration  the family's tunables, every one, as integers
//   objectives     ["time", "tflops"]
//   times          {"runtimes": [median ms]} for an ok row, else [] (per-repeat times are not stored)
//   invalidity     ok: correct; invalid: correctness; compile_error: compile; pruned: constraints;
//                  timeout: timeout; crashed, launch_error, error: runtime
//   correctness    1 for ok, else 0
//   measurements   time, time_p20, time_p80 (ms), reps, tflops (TFLOP/s), gbps (GB/s), max_abs, max_rel,
//                  mse, registers, smem_static and spill_stores (B): every one that is not zero (an ok row
//                  always has time and tflops); a value that is not finite is the string "inf", "-inf" or "nan"
//   flashtune      what T4 has no field for and a store needs: family (and the stored config text
//                  when it is not the canonical one), problem (shape, dtype, causal,
//                  direction, inputs), status, error, kernel_hash, seed, device (name, arch, SM count,
//                  driver), NVRTC version, options, source hash, detail
// The file's metadata: time unit milliseconds, CUDA, the device when there is one, the earliest
// result's time, and every device's arch, SM count and driver. Results are ordered by family, device
// and problem, so an export of the same rows is the same file: export, import into a new store and
// export again gives the same bytes.
#pragma once
#include <functional>
#include <string>
#include <string_view>

#include "results/store.hpp"

namespace flashtune {

// An import file: about 120,000 results. It is streamed (t4_import), so memory does not grow with it: the
// bound is on the time an import takes.
inline constexpr size_t kMaxT4Bytes = 128u << 20;
// One result (or the metadata) is built in memory alone: at most this much of the file (a packed problem that
// lists 65,535 lengths of q and of k takes about 1 MB).
inline constexpr size_t kMaxT4ValueBytes = 4u << 20;
// The distinct devices (name, arch, SM count, driver) one file's results may name.
inline constexpr size_t kMaxT4Devices = 4096;

// The T4 document for the rows the filter selects, one result per line. Throws UsageError naming a
// stored row that this build cannot describe (unknown family, config outside its domain, text that is not
// UTF-8, ...), before anything is written. The rows read are bounded as every read of a store is (ReadBudget);
// the document goes to `write` in pieces (the head, then a result at a time) and is never held whole.
void t4_export(Store&, const ResultFilter&, const std::function<void(std::string_view)>& write);
std::string t4_export(Store&, const ResultFilter&);  // the same document, whole

struct ImportSummary {
  long long provenance_id = 0;
  bool already = false;  // this file's bytes were imported before: nothing copied
  long long total = 0, added = 0, present = 0, differ = 0;
};

// Reads and checks the whole file (untrusted: types, ranges, known families and tunables, statuses
// consistent with invalidity and correctness, the devices against the store's), then copies its
// results in one transaction. Throws UsageError (one line) with the store left as it was. The file is
// streamed twice, result by result (check, then copy), and never held whole: memory stays bounded
// (kMaxT4ValueBytes of JSON at a time) whatever its size; a file that changes between the passes is refused.
ImportSummary t4_import(const std::string& file, const std::string& db);

}  // namespace flashtune
