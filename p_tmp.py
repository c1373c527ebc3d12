import sys, time, copy, statistics
from experiments import cli
import models, chainer, numpy
import cgdp_chainer
from benchmarks import runtime as rt
def main():
    base = models.Classifier(models.get_model(rt.SHORT_NET, seed=0))
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    tl = cgdp_chainer.Timeline()
    up = rt._updater('cgdp', copy.deepcopy(base), n, 4, 8, timeline=tl)
    times=[]
    with up.unattended():
        for i in range(12):
            t=time.perf_counter(); up.update(); times.append(time.perf_counter()-t)
    print('chunks', up.chunk_plan.n_chunks, 'median', statistics.median(times[3:]))
    s = tl.iteration_summaries[3:]
    for k in s[0]:
        try: print(k, statistics.median(x[k] for x in s))
        except Exception: pass
    up.finalize()
    st = rt._updater('standard', copy.deepcopy(base), 1, 4, 8)
    print('standard', statistics.median(rt._iteration_times(st, 9, 3)))
if __name__ == "__main__" and sys.argv[1] != "events":
    main()

def events():
    base = models.Classifier(models.get_model(rt.SHORT_NET, seed=0))
    n = int(sys.argv[2])
    tl = cgdp_chainer.Timeline()
    up = cgdp_chainer.CGDPUpdater(rt._iterator(n, 4, 8), _opt(copy.deepcopy(base)), ['@numpy']*n, timeline=tl, **({} if sys.argv[3] == "default" else {"chunk_size": int(sys.argv[3])}))
    with up.unattended():
        ts=[]
        for i in range(12):
            t=time.perf_counter(); up.update(); ts.append(time.perf_counter()-t)
    print('chunks', up.chunk_plan.n_chunks, 'median', statistics.median(ts[3:]))
    import collections
    agg = collections.defaultdict(float)
    for e in tl.events_of(10):
        agg[(e[1] if not isinstance(e, dict) else e.get('device'), e[2] if not isinstance(e, dict) else e.get('kind'))] += (e[5]-e[4]) if not isinstance(e, dict) else 0
    print(tl.events_of(10)[:3])
    for k,v in sorted(agg.items(), key=str): print(k, round(v*1e3,2))
    up.finalize()
def _opt(m):
    o = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9); o.setup(m); return o
if __name__ == '__main__' and sys.argv[1] == 'events':
    events()
