"""What the ranks' agreement on the tier costs a step (issue 50, ``runtime.tiered``): 2 gloo
processes run a stand-in step (a 64x64 matmul and a 200-float gradient all-reduce) with no
agreement, an asynchronous all-reduce of 3 int32 read at the next step, every step
("async1") or every K steps ("asyncK"), or a blocking one every step ("block1").

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29871 WORLD_SIZE=2 OMP_NUM_THREADS=1 bash -c \
      'RANK=1 python bench/tiered_agree_cost.py & RANK=0 python bench/tiered_agree_cost.py; wait'
"""
import time

import torch
import torch.distributed as dist

MODES = ["none", "async1", "async8", "async16", "async32", "block1"]


def main(rounds=3, n=3000):
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    g, a = torch.randn(200), torch.randn(64, 64)

    def run(mode):
        every = int(mode[5:]) if mode.startswith("async") else 0
        sent = None
        t0 = time.perf_counter()
        for i in range(n):
            if sent is not None:
                sent.wait()
                sent = None
            if every and i % every == 0:
                sent = dist.all_reduce(torch.zeros(3, dtype=torch.int32), async_op=True)
            elif mode == "block1":
                dist.all_reduce(torch.zeros(3, dtype=torch.int32))
            (a @ a).sum()
            dist.all_reduce(g)
        if sent is not None:
            sent.wait()
        return (time.perf_counter() - t0) / n * 1e6
    res = {}
    for _ in range(rounds):
        for mode in MODES:  # alternated: the machine's load drifts
            dist.barrier()
            res.setdefault(mode, []).append(run(mode))
    if dist.get_rank() == 0:
        for m, v in res.items():
            print(f"{m:8s}", " ".join(f"{x:.0f}" for x in v), "us a step")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
