#!/bin/bash
# One bench_precision run per variant, each under the shared lock (the lock is released between variants).
P=cifar_resnet56-03130f
i=0
for V in largest $P.e2.777777777777777777777777777777 $P.e2.555555555555555555555555555555 $P.e2.B5S7555S5B755B75S57BB5BSBB777S $P.e1.7557B5S7577BB7SB757Sxxxxxxxxxx $P.e0.BS5575BBBBxxxxxxxxxxxxxxxxxxxx smallest; do
  i=$((i+1))
  flock /tmp/hmt-bench.lock bash -c "uptime; PYTHONPATH=$PWD python3 scripts/bench_precision.py --supernet hmt/data/embedded/supernet-cifar-resnet56 --converted runs/r56-converted --data ../shared/datasets/cifar10-jpeg --split test --variant $V --compare-unpadded --repeats 200 --out runs/int8-r56/v$i.json; uptime"
done
echo done
