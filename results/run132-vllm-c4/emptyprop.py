import time, json, os
class Empty:
    def __init__(self, cfg): self.rec = []
    def load_model(self, *a, **k): pass
    def propose(self, sampled_token_ids, *a, **k):
        t0 = time.perf_counter()
        r = [[] for _ in sampled_token_ids]
        self.rec.append((t0, time.perf_counter(), sum(1 for s in sampled_token_ids if s), sum(len(s) for s in sampled_token_ids), 0, len(sampled_token_ids)))
        if len(self.rec) % 25 == 0 or self.rec[-1][2] <= 1:
            json.dump(self.rec, open(os.environ["PROPTIME"], "w"))
        return r
