#!/usr/bin/env bash
# Second device call: the quick suite, a zoo subset and compiled training on CUDA on the CPU runs'
# corpus (Python 3.11's standard library, sha c17d741c64d6, through .gpu/pb.py), and the GPU tests.
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1 PYTHONPATH=$PWD/.gpu/site:$PWD
G=/tmp/g; mkdir -p $G; tar xJf .gpu/py311.tar.xz -C /tmp
t0=$(date +%s)
stage() { local name=$1 limit=$2; shift 2; local s=$(date +%s)
  timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s (at $(( $(date +%s) - t0 ))s)" | tee -a $OUT/stages.txt; }
pack() { tar czf $OUT/gpu_runs.tar.gz --exclude='*.pt' -C $G . ; }
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/pip.log 2>&1
{ python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"; } > $OUT/env.txt 2>&1
stage quick 110 python3 .gpu/pb.py -m experiment=quick train.device=cuda out_root=$G name=quick_cuda
pack
cp .gpu/test_fused_paths.py tests/model/test_fused_paths.py
stage tests 50 python3 -m pytest -n 0 -p no:cacheprovider -q -rs tests/run/test_train.py tests/model/test_fused_paths.py tests/experiments/test_bench_throughput.py -k "cuda or gpu"
stage zoo 100 python3 .gpu/pb.py -m experiment=quick pe=pope,fope,cable,bipe,fire,kerple_log train.device=cuda out_root=$G name=zoo_cuda
pack
pack
echo "total $(( $(date +%s) - t0 ))s" >> $OUT/stages.txt
