#!/usr/bin/env bash
# Bad input: one line on stderr naming the problem, exit code 2, and a store left intact.
set -u
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_usage_error() {  # expect_usage_error "<needle>" args...
  local needle=$1; shift
  "$FLASHTUNE" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [[ $rc -ne 2 || $lines -ne 1 ]] || ! grep -q -- "$needle" "$tmp/err"; then
    echo "FAIL: flashtune $* -> rc=$rc, $lines stderr lines, want 2 and 1 line with '$needle':"; cat "$tmp/err"
    fail=1
  fi
}

echo '{"family":"fa2_simt","params":{"BLOCK_M":[48]}}' >"$tmp/bad_space.json"
echo '{"family":"fa2_simt","params":{"BLOCK_M":["64>;evil"]}}' >"$tmp/inject.json"
echo '{"problems":[{"batch":1,"heads":1,"seq":8}]}' >"$tmp/bad_problems.json"
echo '{not json' >"$tmp/broken.json"

expect_usage_error "unknown command" frobnicate
expect_usage_error "unknown option --bogus" tune --bogus
expect_usage_error "takes a space file and a problems file" tune "$SRC/configs/spaces/fa2_simt.json"
expect_usage_error "BLOCK_M = 48 is outside its domain" compile-check "$tmp/bad_space.json"
expect_usage_error "must hold integers only" compile-check "$tmp/inject.json"
expect_usage_error "not valid JSON" compile-check "$tmp/broken.json"
expect_usage_error "cannot read" compile-check "$tmp/missing.json"
expect_usage_error "unsupported arch" compile-check "$SRC/configs/spaces/naive.json" --arch sm_1
expect_usage_error "missing 'head_dim'" tune "$SRC/configs/spaces/naive.json" "$tmp/bad_problems.json" --db "$tmp/x.db"
expect_usage_error "--shape must be B,H,Sq,Sk,d" run --family fa2_simt --params BLOCK_M=64 --shape 1,2,3
expect_usage_error "exactly one of --params and --best" run --family fa2_simt --shape 1,1,8,8,64
expect_usage_error "unknown family" run --family nope --params X=1 --shape 1,1,8,8,64
expect_usage_error "outside its domain" run --family fa2_simt --params BLOCK_M=7 --shape 1,1,8,8,64
expect_usage_error "does not support head_dim" run --family fa2_simt --params BLOCK_M=64 --shape 1,1,8,8,80
expect_usage_error "unknown dtype" run --family fa2_simt --params BLOCK_M=64 --shape 1,1,8,8,64 --dtype fp8
expect_usage_error "--timeout must be a positive number" run --family fa2_simt --params BLOCK_M=64 --shape 1,1,8,8,64 --timeout x
# --inputs: every file must be there with exactly the shape's bytes, checked before any GPU work.
simt="--family fa2_simt --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2 --shape 2,2,130,200,64"
mkdir -p "$tmp/in"
head -c $((2 * 2 * 130 * 64 * 4)) /dev/zero >"$tmp/in/q.bin"
head -c $((2 * 2 * 200 * 64 * 4)) /dev/zero >"$tmp/in/k.bin"
head -c 100 /dev/zero >"$tmp/in/v.bin"
expect_usage_error "input file '$tmp/none/q.bin' does not exist" run $simt --inputs "$tmp/none"
expect_usage_error "input file '$tmp/in/v.bin' has 100 bytes, expected 204800" run $simt --inputs "$tmp/in"
expect_usage_error "q.bin' has 133120 bytes, expected 66560" run --family fa2_mma --params BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2 \
  --shape 2,2,130,200,64 --dtype bf16 --inputs "$tmp/in"
head -c $((2 * 2 * 200 * 64 * 4)) /dev/zero >"$tmp/in/v.bin"
expect_usage_error "input file '$tmp/in/do.bin' does not exist" run --family fa2_simt_bwd \
  --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=2,DQ_MODE=1 --shape 2,2,130,200,64 --inputs "$tmp/in"
expect_usage_error "is over 2^34" run --family fa2_simt_bwd --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=2,DQ_MODE=1 \
  --shape 32,16,1024,1024,64 --inputs "$tmp/in"
# A NaN or Inf in an input file has no reference: refused before any GPU work.
printf '\x00\x00\xc0\x7f' | dd of="$tmp/in/k.bin" bs=1 seek=4000 conv=notrunc status=none
expect_usage_error "k.bin' holds NaN or Inf (element 1000 of 51200)" run $simt --inputs "$tmp/in"
# Input distributions: --input-dist normal|heavy, --input-scale in [0.001, 1000]; not with --inputs.
expect_usage_error "unknown input distribution 'cauchy'" run $simt --input-dist cauchy
expect_usage_error "input scale must be a number in" run $simt --input-scale 1e9
expect_usage_error "--input-scale must be a number" run $simt --input-scale x
expect_usage_error "are for generated ones" run $simt --input-scale 3 --inputs "$tmp/in"
# Grouped-query attention: heads_k must divide heads (and be in range), the family must support it, and
# --inputs' k and v have heads_k heads; all before any GPU work. fa2_wgmma_bwd is a grouped-query family.
wgmma="--family fa2_wgmma_bwd --params BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1 --dtype bf16 --direction bwd"
expect_usage_error "problem field 'heads_k' (3) must divide 'heads' (8)" run $wgmma --shape 1,8,130,200,128 --heads-k 3
expect_usage_error "problem field 'heads_k' (16) must divide 'heads' (8)" run $wgmma --shape 1,8,130,200,128 --heads-k 16
expect_usage_error "--heads-k must be an integer in 1..65536, got '0'" run $wgmma --shape 1,8,130,200,128 --heads-k 0
expect_usage_error "family fa2_simt_bwd does not support grouped-query attention (heads_k)" run --family fa2_simt_bwd \
  --params BLOCK_M=64,BLOCK_N=64,TM=4,TN=2,DQ_MODE=1 --shape 1,8,130,200,64 --direction bwd --heads-k 2
mkdir -p "$tmp/gqa_in"
head -c $((8 * 130 * 128 * 2)) /dev/zero >"$tmp/gqa_in/q.bin"
head -c $((8 * 200 * 128 * 2)) /dev/zero >"$tmp/gqa_in/k.bin"  # 8 heads of k: the kv heads are 2
expect_usage_error "k.bin' has 409600 bytes, expected 102400" run $wgmma --shape 1,8,130,200,128 --heads-k 2 --inputs "$tmp/gqa_in"
echo '{"problems": [{"batch": 1, "heads": 8, "heads_k": 3, "seq": 64, "head_dim": 128, "dtype": "bf16", "direction": "bwd"}]}' \
  >"$tmp/p_gqa.json"
expect_usage_error "must divide 'heads' (8)" tune "$SRC/configs/spaces/fa2_wgmma_bwd.json" "$tmp/p_gqa.json" --db "$tmp/gqa.db"
[[ ! -e "$tmp/gqa.db" ]] || { echo "FAIL: a refused tune created its store"; fail=1; }
expect_usage_error "heads_k needs a grouped-query family" tune "$SRC/configs/spaces/fa2_simt_bwd.json" \
  "$SRC/configs/problems/ragged_gqa_bwd.json" --db "$tmp/gqa.db"
[[ ! -e "$tmp/gqa.db" ]] || { echo "FAIL: a refused tune created its store"; fail=1; }
echo '{"problems": [{"batch": 1, "heads": 1, "seq": 64, "head_dim": 32}]}' >"$tmp/p_dist.json"
expect_usage_error "unknown input distribution 'cauchy'" tune "$SRC/configs/spaces/fault.json" "$tmp/p_dist.json" --input-dist cauchy
expect_usage_error "does not exist" best --db "$tmp/none.db"
expect_usage_error "emit needs --db and --out" emit --db x

# Packed variable-length batches: the lengths' description checked before any GPU work (flags and files).
mma="--family fa2_mma --params BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2 --dtype bf16"
expect_usage_error "--shape must be H,d with --varlen or --seq-lens" run $mma --shape 1,2,8,8,64 --seq-lens 8
expect_usage_error "--shape must be B,H,Sq,Sk,d" run $mma --shape 2,64
expect_usage_error "--seq-lens must be comma-separated integers, got 'x'" run $mma --shape 2,64 --seq-lens 8,x
expect_usage_error "give --varlen or --seq-lens, not both" run $mma --shape 2,64 --seq-lens 8 --varlen '{"seq_lens":[8]}'
expect_usage_error "--seq-lens-k goes with --seq-lens" run $mma --shape 2,64 --seq-lens-k 8
expect_usage_error "query lengths sum to 0" run $mma --shape 2,64 --seq-lens 0,0
expect_usage_error "'seq_lens_k' has 2 lengths, 'seq_lens' 1" run $mma --shape 2,64 --seq-lens 4 --seq-lens-k 4,4
expect_usage_error "holds -4, not a length" run $mma --shape 2,64 --seq-lens 8,-4
expect_usage_error "holds 4294967304, not a length" run $mma --shape 2,64 --seq-lens 4294967304
expect_usage_error "--varlen: varlen 'min' (9) is above 'max' (4)" run $mma --shape 2,64 \
  --varlen '{"lengths":"uniform","min":9,"max":4,"total_tokens":10}'
expect_usage_error "unknown varlen field 'length' for lengths \"uniform\"" run $mma --shape 2,64 \
  --varlen '{"lengths":"uniform","min":1,"max":4,"total_tokens":10,"length":3}'
expect_usage_error "varlen 'seed' must be an integer" run $mma --shape 2,64 \
  --varlen '{"lengths":"uniform","min":1,"max":4,"total_tokens":10,"seed":1e300}'
expect_usage_error "more than 65535 sequences" run $mma --shape 2,64 \
  --varlen '{"lengths":"fixed","length":1,"total_tokens":70000}'
expect_usage_error "is over 2^31 - 1" run $mma --shape 4096,128 --varlen '{"lengths":"fixed","length":4096,"total_tokens":16777216}'
expect_usage_error "not valid JSON" run $mma --shape 2,64 --varlen '{"seq_lens":[8'
expect_usage_error "cannot read '$tmp/none_varlen.json'" run $mma --shape 2,64 --varlen "$tmp/none_varlen.json"
expect_usage_error "does not support packed variable-length batches" run --family fa2_simt --params BLOCK_M=64 --shape 2,64 --seq-lens 8
expect_usage_error "a packed variable-length batch uses generated inputs" run $mma --shape 2,64 --seq-lens 8 --inputs "$tmp/in"
python3 -c "import json; print(json.dumps({'problems': [{'heads': 2, 'head_dim': 64, 'varlen': {'seq_lens': [1] * 65536}}]}))" >"$tmp/vl_many.json"
expect_usage_error "must be an array of 1..65535 lengths" tune "$SRC/configs/spaces/fa2_mma.json" "$tmp/vl_many.json" --db "$tmp/x.db"
echo '{"problems":[{"batch":3,"heads":2,"head_dim":64,"varlen":{"seq_lens":[4,8]}}]}' >"$tmp/vl_batch.json"
expect_usage_error "problem field 'batch' is 3, but the varlen lengths give 2" tune "$SRC/configs/spaces/fa2_mma.json" "$tmp/vl_batch.json" --db "$tmp/x.db"
echo '{"problems":[{"heads":2,"head_dim":64,"seq":8,"varlen":{"seq_lens":[4,8]}}]}' >"$tmp/vl_seq.json"
expect_usage_error "problem field 'seq' goes with dense problems" tune "$SRC/configs/spaces/fa2_mma.json" "$tmp/vl_seq.json" --db "$tmp/x.db"
echo '{"problems":[{"heads":2,"head_dim":64,"varlen":{"seq_lens":[4,8]}}]}' >"$tmp/vl_ok.json"
expect_usage_error "no problem in $tmp/vl_ok.json matches a variant" tune "$SRC/configs/spaces/fa2_simt.json" "$tmp/vl_ok.json" --db "$tmp/x.db"
echo '{"family":"fa2_simt","varlen":[true]}' >"$tmp/vl_space.json"
expect_usage_error "family fa2_simt does not support packed variable-length batches" compile-check "$tmp/vl_space.json"
echo '{"name":"x","problems":{"problems":[{"heads":2,"head_dim":64,"varlen":{"seq_lens":[4,8]}}]},"implementations":["fa2_mma"]}' >"$tmp/e_vl.json"
expect_usage_error "measured by experiments/varlen_vs_peers.py" experiment "$tmp/e_vl.json" --dry-run
expect_usage_error "problems takes one problems file" problems
expect_usage_error "cannot read" problems "$tmp/none.json"
"$FLASHTUNE" problems "$tmp/vl_ok.json" --json | python3 -c "import json,sys; p=json.load(sys.stdin)[0]; assert p['cu_seqlens_q']==[0,4,12] and p['batch']==2 and p['seq_q']==8, p" ||
  { echo "FAIL: problems --json of a packed batch"; fail=1; }
[[ ! -e "$tmp/x.db" ]] || { echo "FAIL: a refused tune created its store"; fail=1; }

# Sliding windows and softcaps (issue 32): --window L,R and --softcap C, problem fields "window" and "softcap"; a
# family without them refuses such a problem before any GPU work.
fa3="--family fa3_wgmma --params BLOCK_N=64 --shape 1,2,300,300,128 --dtype bf16"
expect_usage_error "--window must be L,R" run $fa3 --window 4
expect_usage_error "--window L must be an integer, got 'x'" run $fa3 --window x,4
expect_usage_error "--window R must be -1 (unbounded) or a key count in 0..1073741824, got -2" run $fa3 --window 4,-2
expect_usage_error "--window L must be -1 (unbounded) or a key count in 0..1073741824, got 2147483648" run $fa3 --window 2147483648,0
expect_usage_error "--softcap must be 0 (off) or a number in .0.001, 1000000., got -1" run $fa3 --softcap -1
expect_usage_error "--softcap must be 0 (off) or a number in .0.001, 1000000., got inf" run $fa3 --softcap inf
expect_usage_error "--softcap must be a number, got '3x'" run $fa3 --softcap 3x
expect_usage_error "family fa2_simt does not support sliding windows (window)" run --family fa2_simt --params BLOCK_M=64 \
  --shape 1,2,64,64,64 --dtype fp32 --window 16,16
expect_usage_error "family fa2_simt does not support logit softcapping (softcap)" run --family fa2_simt --params BLOCK_M=64 \
  --shape 1,2,64,64,64 --dtype fp32 --softcap 30
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"window":[4]}]}' >"$tmp/w_short.json"
expect_usage_error "problem field 'window' must be \[left, right\]" problems "$tmp/w_short.json"
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"window":[4.5,0]}]}' >"$tmp/w_float.json"
expect_usage_error "problem field 'window' left must be an integer, got 4.5" problems "$tmp/w_float.json"
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"softcap":"30"}]}' >"$tmp/w_cap.json"
expect_usage_error "problem field 'softcap' must be a number" problems "$tmp/w_cap.json"
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"dtype":"bf16","window":[8,0],"softcap":30}]}' >"$tmp/w_ok.json"
"$FLASHTUNE" problems "$tmp/w_ok.json" | grep -q "B1 H2 Sq64 Sk64 d64 bf16 causal window 8,-1 softcap 30" ||
  { echo "FAIL: problems does not print the window and softcap"; "$FLASHTUNE" problems "$tmp/w_ok.json"; fail=1; }
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"dtype":"fp32","window":[8,0],"softcap":30}]}' >"$tmp/w_ok32.json"
expect_usage_error "no problem in $tmp/w_ok32.json matches a variant" tune "$SRC/configs/spaces/fa2_simt.json" "$tmp/w_ok32.json" --db "$tmp/x.db"
# Accepted flags reach the GPU step (here: none, exit 1), not a usage error: fa3_wgmma, and fa2_mma (sm_80's forward).
"$FLASHTUNE" run $fa3 --window 128,-1 --softcap 30 >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 2 ]] || { echo "FAIL: run --window 128,-1 --softcap 30 was refused:"; cat "$tmp/err"; fail=1; }
"$FLASHTUNE" run --family fa2_mma --params BLOCK_M=64 --shape 1,2,64,64,64 --dtype bf16 --window 16,16 --softcap 30 \
  --alibi >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 2 ]] || { echo "FAIL: run --family fa2_mma --window 16,16 --softcap 30 --alibi was refused:"; cat "$tmp/err"; fail=1; }
# The backward: fa3_wgmma_bwd and fa2_mma_bwd (sm_80's) take them; every other backward family refuses them in a
# line, in run and tune.
expect_usage_error "family fa2_wgmma_bwd does not support sliding windows (window)" run --family fa2_wgmma_bwd \
  --params BLOCK_M=64 --direction bwd --shape 1,2,300,300,128 --dtype bf16 --window 64,-1
expect_usage_error "family fa2_simt_bwd does not support logit softcapping (softcap)" run --family fa2_simt_bwd \
  --params BLOCK_M=64 --direction bwd --shape 1,2,300,300,64 --dtype fp32 --softcap 30
"$FLASHTUNE" run --family fa2_mma_bwd --params BLOCK_M=64 --direction bwd --shape 1,2,300,300,64 --dtype bf16 \
  --window 16,16 --softcap 30 --alibi >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 2 ]] || { echo "FAIL: run --family fa2_mma_bwd --window 16,16 --softcap 30 --alibi was refused:"; cat "$tmp/err"; fail=1; }
# ... up to d 128 (Family::mods_max_head_dim: past it the kernels spill).
expect_usage_error "family fa2_mma_bwd has window up to head_dim 128, not 256" run --family fa2_mma_bwd \
  --params BLOCK_M=32 --direction bwd --shape 1,2,64,64,256 --dtype bf16 --window 8,0
expect_usage_error "no problem in $SRC/configs/problems/ragged_window_bwd_bf16.json matches a variant" tune \
  "$SRC/configs/spaces/fa2_wgmma_bwd.json" "$SRC/configs/problems/ragged_window_bwd_bf16.json" --db "$tmp/x.db"
"$FLASHTUNE" run --family fa3_wgmma_bwd --params BLOCK_M=64,CONSUMERS=2 --direction bwd --shape 1,2,300,300,128 \
  --dtype bf16 --causal --window 64,-1 --softcap 30 >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 2 ]] || { echo "FAIL: run fa3_wgmma_bwd --window 64,-1 --softcap 30 was refused:"; cat "$tmp/err"; fail=1; }

# Paged K/V caches: the description checked before any GPU work (flags, files, the family's page condition).
dec="--family decode_splitkv --params SPLITS=16,BLOCK_N=64,WARPS=4,STAGES=2 --dtype bf16 --heads-k 2"
expect_usage_error "--paged: paged 'page_size' must be a multiple of 16 in 16..1048576, got 100" run $dec --shape 2,8,1,512,128 \
  --paged '{"page_size":100}'
expect_usage_error "--paged: unknown paged field 'pages'" run $dec --shape 2,8,1,512,128 --paged '{"page_size":64,"pages":3}'
expect_usage_error "--paged: paged needs 'page_size'" run $dec --shape 2,8,1,512,128 --paged '{}'
expect_usage_error "--paged: problem field 'batch' is 2, but the paged seq_lens_k give 3" run $dec --shape 2,8,1,512,128 \
  --paged '{"page_size":64,"seq_lens_k":[512,1,0]}'
expect_usage_error "--paged: problem field 'seq_k' is 512, but the paged seq_lens_k give 300" run $dec --shape 2,8,1,512,128 \
  --paged '{"page_size":64,"seq_lens_k":[300,1]}'
expect_usage_error "--paged: paged 'seq_lens_k' holds -1, not a length" run $dec --shape 2,8,1,512,128 --paged '{"page_size":64,"seq_lens_k":[-1,3]}'
expect_usage_error "--paged: paged 'seed' must be an integer in 0..2^53" run $dec --shape 2,8,1,512,128 --paged '{"page_size":64,"seed":-3}'
expect_usage_error "--paged: problem fields 'paged' and 'varlen' do not combine" run $dec --shape 8,128 --seq-lens 8,8 --paged '{"page_size":64}'
expect_usage_error "not valid JSON" run $dec --shape 2,8,1,512,128 --paged '{"page_size":64'
expect_usage_error "--paged: paged 'layout' must be \"hnd\" (pools" run $dec --shape 2,8,1,512,128 \
  --paged '{"page_size":64,"layout":"bhsd"}'
expect_usage_error "cannot read '$tmp/none_paged.json'" run $dec --shape 2,8,1,512,128 --paged "$tmp/none_paged.json"
expect_usage_error "BLOCK_N must divide the page size (a block of keys is read from one page) (32)" run $dec --shape 2,8,1,512,128 \
  --paged '{"page_size":32}'
expect_usage_error "family fa2_mma does not read paged K/V caches" run $mma --shape 2,8,1,512,64 --paged '{"page_size":64}'
expect_usage_error "a paged K/V cache uses generated inputs" run $dec --shape 2,8,1,512,128 --paged '{"page_size":64}' --inputs "$tmp/in"
echo '{"problems":[{"heads":8,"heads_k":2,"seq_q":1,"head_dim":128,"dtype":"bf16","direction":"bwd","paged":{"page_size":64,"seq_lens_k":[5]}}]}' >"$tmp/pg_bwd.json"
expect_usage_error "problem field 'paged' goes with forward problems" tune "$SRC/configs/spaces/decode_splitkv.json" "$tmp/pg_bwd.json" --db "$tmp/x.db"
echo '{"problems":[{"heads":8,"heads_k":2,"seq_q":1,"head_dim":128,"dtype":"bf16","paged":{"page_size":64,"seq_lens_k":[5,300]}}]}' >"$tmp/pg_ok.json"
expect_usage_error "no problem in $tmp/pg_ok.json matches a variant" tune "$SRC/configs/spaces/fa2_mma.json" "$tmp/pg_ok.json" --db "$tmp/x.db"
echo '{"family":"fa2_mma","paged":[true]}' >"$tmp/pg_space.json"
expect_usage_error "family fa2_mma does not read paged K/V caches" compile-check "$tmp/pg_space.json"
echo '{"name":"x","problems":{"problems":[{"batch":1,"heads":8,"heads_k":2,"seq_q":1,"seq_k":64,"head_dim":128,"dtype":"bf16","paged":{"page_size":64}}]},"implementations":["decode_splitkv"]}' >"$tmp/e_pg.json"
expect_usage_error "measured by experiments/decode_vs_peers.py --paged" experiment "$tmp/e_pg.json" --dry-run
"$FLASHTUNE" problems "$tmp/pg_ok.json" --json | python3 -c "import json,sys; p=json.load(sys.stdin)[0]; assert p['cache_seqlens']==[5,300] and p['batch']==2 and p['seq_k']==300 and p['num_pages']==6, p" ||
  { echo "FAIL: problems --json of a paged cache"; fail=1; }
[[ ! -e "$tmp/x.db" ]] || { echo "FAIL: a refused tune created its store"; fail=1; }

# A foreign SQLite file is refused and left as it was.
python3 - "$tmp/foreign.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute("create table precious(x)"); c.execute("insert into precious values (7)"); c.commit()
PY
before=$(sha256sum "$tmp/foreign.db")
expect_usage_error "is not a flashtune database" best --db "$tmp/foreign.db"
expect_usage_error "is not a flashtune database" tune "$SRC/configs/spaces/naive.json" "$SRC/configs/problems/smoke.json" --db "$tmp/foreign.db"
[[ "$(sha256sum "$tmp/foreign.db")" == "$before" ]] || { echo "FAIL: foreign DB modified"; fail=1; }

# Experiments: bad definitions are refused before any GPU work; every committed one is valid.
echo '{"name":"x","problems":{"problems":[{"batch":1,"heads":1,"seq":8,"head_dim":64}]},"implementations":["fa9"]}' >"$tmp/e1.json"
echo '{"name":"x","problems":{"problems":[{"batch":1,"heads":1,"seq":8,"head_dim":64}]},"implementations":["torch_flash"],"plot":"pie"}' >"$tmp/e2.json"
echo '{"name":"x","problems":{"problems":[{"batch":1,"heads":1,"seq":8,"head_dim":64}]},"implementations":["fa2_simt:best"]}' >"$tmp/e3.json"
echo '{"name":"x","problems":{"problems":[{"batch":1,"heads":1,"seq":8,"head_dim":64}]},"implementation":["fa2_simt"]}' >"$tmp/e4.json"
expect_usage_error "unknown family 'fa9'" experiment "$tmp/e1.json" --dry-run
expect_usage_error "unknown plot 'pie'" experiment "$tmp/e2.json" --dry-run
expect_usage_error "must be ':tuned' or ':default'" experiment "$tmp/e3.json" --dry-run
expect_usage_error "unknown key 'implementation'" experiment "$tmp/e4.json" --dry-run
expect_usage_error "does not exist" experiment "$tmp/none.json"
for e in "$SRC"/experiments/*.json; do
  "$FLASHTUNE" experiment "$e" --dry-run >"$tmp/plan" 2>"$tmp/err" || { echo "FAIL: $e"; cat "$tmp/err"; fail=1; }
  grep -q " rows, " "$tmp/plan" || { echo "FAIL: no plan for $e"; fail=1; }
done

# mask_mod (issue 32, part 3): a predicate that would be more than a function body, one that NVRTC rejects, a tensor
# the predicate does not read and one it reads but nothing gives: one line each, exit 2, before any GPU work.
printf '\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00' >"$tmp/doc.bin"
fa3m="--family fa3_wgmma --params BLOCK_N=64 --shape 1,2,300,300,128 --dtype bf16"
expect_usage_error "mask_mod may not hold '#'" run $fa3m --mask-mod '#include <cstdio>
return true;'
expect_usage_error "mask_mod has an unbalanced '}' at column 11" run $fa3m --mask-mod 'return 1; } __global__ void f() {'
expect_usage_error "mask_mod has an unclosed '{'" run $fa3m --mask-mod 'if (q_idx > 0) { return true; return false;'
expect_usage_error "mask_mod may not use the identifier '__asm__'" run $fa3m --mask-mod '__asm__ volatile(); return true;'
expect_usage_error "mask_mod does not compile: no suitable conversion function from \"const flashtune::MaskTensor\" to" \
  run $fa3m --mask-mod 'int d = doc; return d > 0;' --mask-tensor doc="$tmp/doc.bin"
expect_usage_error "mask_mod does not compile: identifier \"dox\" is undefined (at column 1: \"dox\[q_idx\] == doc" \
  run $fa3m --mask-mod 'dox[q_idx] == doc[kv_idx]' --mask-tensor doc="$tmp/doc.bin"
expect_usage_error "mask_mod does not compile: a path of the predicate ends without a return" \
  run $fa3m --mask-mod 'if (kv_idx <= q_idx) return true;'
expect_usage_error "mask_mod tensor 'pos' is not read by the predicate" \
  run $fa3m --mask-mod 'doc[q_idx] == doc[kv_idx]' --mask-tensor doc="$tmp/doc.bin",pos="$tmp/doc.bin"
expect_usage_error "mask_mod does not compile: identifier \"doc\" is undefined" run $fa3m --mask-mod 'doc[q_idx] == doc[kv_idx]'
expect_usage_error "mask_mod tensor 'doc': file '$tmp/none.bin' does not exist" \
  run $fa3m --mask-mod 'doc[q_idx] == 0' --mask-tensor doc="$tmp/none.bin"
expect_usage_error "--mask-tensor goes with --mask-mod" run $fa3m --mask-tensor doc="$tmp/doc.bin"
expect_usage_error "--mask-tensor must be NAME=FILE" run $fa3m --mask-mod 'doc[q_idx] == 0' --mask-tensor doc
expect_usage_error "mask_mod and 'window' do not combine" run $fa3m --mask-mod 'kv_idx <= q_idx' --window 16,0
expect_usage_error "family fa2_simt does not support a mask predicate (mask_mod)" run --family fa2_simt --params BLOCK_M=64 \
  --shape 1,2,64,64,64 --dtype fp32 --mask-mod 'kv_idx <= q_idx'
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"dtype":"bf16","causal":true,
  "mask_mod":{"predicate":"doc[q_idx] == doc[kv_idx] // a comment","tensors":{"doc":{"segments":[40,24]}}}}]}' >"$tmp/m_ok.json"
"$FLASHTUNE" problems "$tmp/m_ok.json" | grep -q "B1 H2 Sq64 Sk64 d64 bf16 causal mask_mod [0-9a-f]\{16\}(doc)" ||
  { echo "FAIL: problems does not print the mask_mod"; "$FLASHTUNE" problems "$tmp/m_ok.json"; fail=1; }
echo '{"problems":[{"batch":1,"heads":2,"seq":64,"head_dim":64,"mask_mod":{"predicate":"doc[q_idx] ==","tensors":{"doc":[1]}}}]}' >"$tmp/m_bad.json"
expect_usage_error "mask_mod does not compile: expected an expression" tune "$SRC/configs/spaces/fa3_wgmma.json" "$tmp/m_bad.json" --db "$tmp/x.db"

# Every verb has --help (exit 0).
for verb in devices compile-check tune run best emit drop-cubins experiment report problems; do
  "$FLASHTUNE" $verb --help >/dev/null || { echo "FAIL: $verb --help"; fail=1; }
done
[[ $fail -eq 0 ]] && echo "cli_errors: all passed"
exit $fail
