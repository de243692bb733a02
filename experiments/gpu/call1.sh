#!/usr/bin/env bash
# One device call: the quick suite, a zoo subset and compiled training on CUDA, the GPU tests and
# the throughput benchmark. Each stage is time-boxed and leaves its log under $OUT.
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1 PYTHONPATH=$PWD/.gpu/site
G=/tmp/g; mkdir -p $G
t0=$(date +%s)
stage() { local name=$1 limit=$2; shift 2; local s=$(date +%s)
  timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s (at $(( $(date +%s) - t0 ))s)" | tee -a $OUT/stages.txt; }
pack() { tar czf $OUT/gpu_runs.tar.gz --exclude='*.pt' -C $G . ; }
{ nvidia-smi; python3 -V; python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.backends.cpu.get_cpu_capability())"; nproc; } > $OUT/env.txt 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >> $OUT/env.txt 2>&1 || echo "pip -e failed" >> $OUT/env.txt
echo "sha $(git rev-parse HEAD 2>/dev/null)" >> $OUT/env.txt
PB="python3 -c 'import sys;from pe_bench.cli.bench import main;sys.exit(main())'"
stage quick 170 bash -c "$PB -m experiment=quick train.device=cuda out_root=$G name=quick_cuda"
pack
stage tests 110 python3 -m pytest -n 0 -p no:cacheprovider -q -rs tests/run/test_train.py tests/model/test_fused_paths.py tests/experiments/test_bench_throughput.py -k "cuda or gpu"
stage bench 80 python3 experiments/bench_throughput.py --device cuda --no-x-transformers --schemes rope,alibi,t5,nope,pope,cable --steps 20 --repeats 3 --out $OUT/throughput_d256.csv
stage zoo 120 bash -c "$PB -m experiment=quick pe=pope,fope,cable,bipe,fire,kerple_log train.device=cuda out_root=$G name=zoo_cuda"
pack
stage compile 90 bash -c "$PB -m experiment=quick pe=rope,alibi train.device=cuda train.compile=true out_root=$G name=quick_cuda_compile"
pack
stage bench124 60 python3 experiments/bench_throughput.py --device cuda --no-x-transformers --schemes rope,alibi --d-model 768 --layers 12 --heads 12 --seq-len 512 --batch 32 --steps 10 --repeats 2 --out $OUT/throughput_g124m.csv
echo "total $(( $(date +%s) - t0 ))s" >> $OUT/stages.txt
