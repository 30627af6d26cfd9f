import time, json, os
from lookahead.vllm.proposer import LookaheadProposer
class Timed(LookaheadProposer):
    def __init__(self, cfg):
        super().__init__(cfg); self.rec = []
    def propose(self, sampled_token_ids, *a, **k):
        t0 = time.perf_counter()
        r = super().propose(sampled_token_ids, *a, **k)
        t1 = time.perf_counter()
        self.rec.append((t0, t1, sum(1 for s in sampled_token_ids if s), sum(len(s) for s in sampled_token_ids), sum(len(x) for x in r), len(sampled_token_ids)))
        if len(self.rec) % 25 == 0 or self.rec[-1][2] <= 1:
            json.dump(self.rec, open(os.environ["PROPTIME"], "w"))
        return r
