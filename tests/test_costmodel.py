"""The cost model: simulator against hand-computed cases, closed forms,
FLOP counting, profiles and bad input."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

from cgdp_chainer import costmodel
from cgdp_chainer.costmodel import costs as costs_module
from cgdp_chainer.costmodel import functions
from cgdp_chainer.costmodel import layers
from cgdp_chainer.costmodel import hardware
from cgdp_chainer.costmodel import Workload

HUGE = 1e15


def make_hardware(**changes):
    """A GPU machine whose costs are easy to compute by hand: no latencies
    or overheads, and nothing shared unless a test says so."""
    fields = dict(
        name='test', description='hand-computable', kind='gpu',
        physical_devices=8, peak_flops=1e12, compute_efficiency=1.0,
        device_memory_bw=HUGE, device_array_overhead_s=0.0,
        devices_per_socket=8, host_link_bw=100.0, host_link_shared=1,
        copy_latency_s=0.0, copy_engine_bw=100.0, peer_scope='all',
        peer_bw=100.0, socket_link_bw=HUGE, host_memory_bw=HUGE,
        host_threads=1, host_thread_bw=HUGE, host_servers=1,
        host_op_overhead_s=0.0, host_update_overhead_s=0.0,
        host_chunk_overhead_s=0.0, chunk_overhead_s=0.0)
    fields.update(changes)
    return hardware.Hardware(**fields)


def workload(forward, backward, param_bytes, arrays=None):
    return Workload(forward_s=list(forward), backward_s=list(backward),
                    param_bytes=list(param_bytes),
                    param_arrays=list(arrays if arrays is not None
                                      else [1] * len(forward)))


def both(work, hw, n, chunk_size):
    """Simulated and closed-form CGDP seconds."""
    simulated = costmodel.simulate_cgdp(work, hw, n, chunk_size).iteration_s
    closed = costmodel.cgdp_closed_form(work, hw, n, chunk_size)
    return simulated, closed


# ------------------------------------------------ hand-computed CGDP cases

def test_one_chunk_exposes_the_whole_sync():
    # F = 3, B = 6; 400 bytes at 100 B/s: d2h 4, h2d 4; the host job moves
    # 5 bytes per byte for one device (its slot is lent, MomentumSGD moves
    # 5): 2000 bytes at 2000 B/s = 1.
    hw = make_hardware(host_thread_bw=2000.0)
    work = workload([1, 2], [2, 4], [100, 300])
    simulated, closed = both(work, hw, 1, chunk_size=2)
    assert simulated == pytest.approx(3 + 6 + 4 + 1 + 4)
    assert closed == pytest.approx(simulated)


def test_perfect_overlap_leaves_only_the_input_chunk_exposed():
    # Each chunk's sync (0.1 + 0.1 + 0.1) hides behind the next backward
    # (2): only the input-side chunk's sync shows.
    hw = make_hardware(host_thread_bw=900.0)
    work = workload([1, 1, 1], [2, 2, 2], [10, 10, 10])
    for n in (1, 2, 4):
        simulated, closed = both(work, hw, n, chunk_size=1)
        host = 10 * costmodel.host_traffic_bytes(n, 1) / 900.0
        assert simulated == pytest.approx(3 + 6 + 0.1 + host + 0.1)
        assert closed == pytest.approx(simulated)


def test_link_bound_pipeline():
    # Copies of 1 s dominate 0.1 s backwards: the d2h engine and then the
    # h2d engine are the bottleneck: F + b1 + 3 d2h + last h2d.
    work = workload([0.1] * 3, [0.1] * 3, [100] * 3)
    simulated, closed = both(work, make_hardware(), 2, chunk_size=1)
    assert simulated == pytest.approx(0.3 + 0.1 + 3 * 1.0 + 1.0)
    assert closed == pytest.approx(simulated)


def test_shared_link_halves_each_device_share():
    # Two devices behind one switch uplink: each copy runs at 50 B/s.
    work = workload([0.1] * 3, [0.1] * 3, [100] * 3)
    hw = make_hardware(host_link_shared=2)
    simulated, closed = both(work, hw, 2, chunk_size=1)
    assert simulated == pytest.approx(0.3 + 0.1 + 3 * 2.0 + 2.0)
    assert closed == pytest.approx(simulated)
    # One device alone on the shared link gets all of it.
    alone, _ = both(work, hw, 1, chunk_size=1)
    assert alone == pytest.approx(0.3 + 0.1 + 3 * 1.0 + 1.0)


def test_host_bound_pipeline():
    # Host jobs of 1 s each (500 bytes of traffic at 500 B/s for N = 1)
    # dominate; copies take 1e-4 s.
    hw = make_hardware(host_link_bw=1e6, copy_engine_bw=1e6,
                       host_thread_bw=500.0)
    work = workload([0.1] * 3, [0.1] * 3, [100] * 3)
    simulated, closed = both(work, hw, 1, chunk_size=1)
    assert simulated == pytest.approx(0.3 + 0.1 + 1e-4 + 3 * 1.0 + 1e-4)
    assert closed == pytest.approx(simulated)
    # Three host threads take one chunk each: the input chunk's job starts
    # when its own copy lands.
    parallel = hw.replace(host_threads=3, host_servers=3)
    simulated, closed = both(work, parallel, 1, chunk_size=1)
    assert simulated == pytest.approx(0.3 + 0.3 + 1e-4 + 1.0 + 1e-4)
    assert closed == pytest.approx(simulated)


def test_host_memory_contention_slows_the_simulation_only():
    # When copies and host threads share a socket's memory, the simulation
    # charges the contention and the closed form does not.
    work = workload([0.1] * 4, [0.1] * 4, [100] * 4)
    hw = make_hardware(host_memory_bw=150.0, host_thread_bw=900.0)
    simulated, closed = both(work, hw, 2, chunk_size=1)
    assert simulated > closed * 1.05


def test_typical_hand_computed():
    # N = 2, F = 1, B = 2, 100 bytes at 100 B/s on the peer link, add and
    # update free. Replica 1 starts one broadcast (1 s) after device 0, so
    # the gather starts at U + 4 and the update ends at U + 5.
    work = workload([1.0], [2.0], [100])
    hw = make_hardware()
    simulated = costmodel.simulate_typical(work, hw, 2).iteration_s
    closed = costmodel.typical_closed_form(work, hw, 2)
    assert simulated == pytest.approx(5.0)
    assert closed == pytest.approx(5.0)
    assert costmodel.simulate_typical(work, hw, 1).iteration_s == \
        pytest.approx(3.0)


def test_typical_staged_through_host_crosses_both_links():
    # Without peer links a copy goes up one PCIe link and down another.
    work = workload([1.0], [2.0], [100])
    hw = make_hardware(peer_scope='none', peer_bw=0.0, host_link_bw=50.0)
    assert costmodel.typical_closed_form(work, hw, 2) == pytest.approx(
        3.0 + 2.0 + 2.0 - 2.0 + 2.0)  # pipelined broadcast, see above
    assert costmodel.simulate_typical(work, hw, 2).iteration_s == \
        pytest.approx(costmodel.typical_closed_form(work, hw, 2))


# --------------------------------------- closed form and simulation agree

@pytest.mark.parametrize('n', [1, 2, 3, 4])
@pytest.mark.parametrize('chunk_size', [1, 2, 3, 7])
def test_closed_form_matches_simulation_without_contention(n, chunk_size):
    rng = numpy.random.RandomState(n * 10 + chunk_size)
    stages = 7
    work = workload(rng.uniform(0.01, 0.2, stages),
                    rng.uniform(0.02, 0.4, stages),
                    [int(b) for b in rng.randint(0, 4000, stages)],
                    [int(a) for a in rng.randint(0, 5, stages)])
    hw = make_hardware(copy_latency_s=1e-3, host_thread_bw=2e4,
                       host_update_overhead_s=1e-3, host_link_bw=2e4,
                       copy_engine_bw=2e4, host_chunk_overhead_s=1e-3,
                       chunk_overhead_s=0.03, device_memory_bw=1e5,
                       device_array_overhead_s=1e-3)
    simulated, closed = both(work, hw, n, chunk_size)
    assert closed == pytest.approx(simulated, rel=1e-9)
    assert costmodel.cgdp_critical_path(work, hw, n, chunk_size) == \
        pytest.approx(closed, rel=1e-9)
    typical = costmodel.simulate_typical(work, hw, n).iteration_s
    assert costmodel.typical_closed_form(work, hw, n) == pytest.approx(
        typical, rel=1e-9)


def test_presets_closed_form_close_to_simulation():
    # Real presets share host memory, so the two differ, but not wildly.
    work = workload([0.01] * 10, [0.02] * 10, [4_000_000] * 10, [2] * 10)
    for name in ('minsky', 'pcie3', 'h100-pcie5', 'gh200'):
        hw = hardware.get_hardware(name)
        for n in (1, 4):
            simulated, closed = both(work, hw, n, 2)
            assert closed == pytest.approx(simulated, rel=0.25)


# ------------------------- one buffer per chunk: CGDP's counts per chunk

def one_layer_in(arrays, param_bytes=4000):
    """One layer of ``param_bytes`` parameter bytes split into ``arrays``
    arrays (everything else the same)."""
    return workload([0.1], [0.2], [param_bytes], [arrays])


def test_cgdp_copy_latency_does_not_grow_with_a_chunks_arrays():
    # Latency-bound copies: 1 ms per copy call, the bytes nearly free.
    hw = make_hardware(copy_latency_s=1e-3, host_link_bw=1e9,
                       copy_engine_bw=1e9, peer_bw=1e9)
    one, many = one_layer_in(1), one_layer_in(100)
    for n in (1, 2, 4):
        assert both(many, hw, n, 1) == pytest.approx(both(one, hw, n, 1))
        d2h_one = costmodel.cgdp_phases(one, hw, n, 1)['d2h']
        d2h_many = costmodel.cgdp_phases(many, hw, n, 1)['d2h']
        assert d2h_many == pytest.approx(d2h_one)
        # ... and a copy still pays its latency once.
        assert d2h_one[0] >= hw.copy_latency_s
    # ParallelUpdater still copies array by array: with two replicas one
    # gather and one broadcast on the critical path, each 99 calls longer.
    for predict in (costmodel.typical_closed_form,
                    lambda w, h, n: costmodel.simulate_typical(
                        w, h, n).iteration_s):
        grown = predict(many, hw, 2) - predict(one, hw, 2)
        assert grown == pytest.approx(2 * 99 * hw.copy_latency_s)
        assert predict(many, hw, 4) > predict(one, hw, 4) + \
            2 * 99 * hw.copy_latency_s


@pytest.mark.parametrize('fused', [False, True])
def test_cgdp_host_work_does_not_grow_with_a_chunks_arrays(fused):
    # Every host operation costs 1 ms per call and nothing per byte; a CPU
    # worker's copy into its shared slot 1 ms per call.
    def measured(arrays):
        profile = cpu_profile()
        profile['layers'][0].update(param_bytes=4000, param_arrays=arrays)
        profile['copy']['latency_s'] = 1e-3
        for op in profile['host']['ops'].values():
            op['per_array_s'] = 1e-3
        if fused:
            profile['host']['fused'] = {'momentum_sgd': {
                'per_array_s': 1e-3, 'per_byte_s': 0.0,
                'per_slot_byte_s': 0.0}}
        hw = hardware.get_hardware('this-cpu', profile).replace(
            host_chunk_overhead_s=0.0)
        return costmodel.build_workload(profile, hw, 1), hw
    (one, hw), (many, _) = measured(1), measured(100)
    for n in (1, 2):
        assert costmodel.host_job_seconds(many, hw, n, 100, 4000) == \
            pytest.approx(costmodel.host_job_seconds(one, hw, n, 1, 4000))
        for workers in ('process', 'thread'):
            assert costmodel.simulate_cgdp(
                many, hw, n, 1, workers=workers).iteration_s == \
                pytest.approx(costmodel.simulate_cgdp(
                    one, hw, n, 1, workers=workers).iteration_s)
            assert costmodel.cgdp_closed_form(
                many, hw, n, 1, workers=workers) == pytest.approx(
                    costmodel.cgdp_closed_form(one, hw, n, 1,
                                               workers=workers))
    # ParallelUpdater on CPUs: addgrads and copyparams per other replica
    # and the update, each 99 calls more.
    for n in (1, 2, 3):
        grown = (costmodel.typical_closed_form(many, hw, n)
                 - costmodel.typical_closed_form(one, hw, n))
        assert grown == pytest.approx(99 * 1e-3 * (1 + 2 * (n - 1)))
        assert costmodel.simulate_typical(many, hw, n).iteration_s == \
            pytest.approx(costmodel.typical_closed_form(many, hw, n))


def test_cgdp_gathers_a_chunks_gradients_once_on_the_device():
    # GPUs: the chunk's gradients are packed into its flat buffer after its
    # backward (at least reading and writing its bytes), one kernel
    # whatever its array count; the typical baseline's per-array device
    # overheads still grow with the arrays.
    hw = make_hardware(device_memory_bw=1e5, device_array_overhead_s=1e-3)
    one, many = one_layer_in(1), one_layer_in(100)
    backward_one = costmodel.cgdp_phases(one, hw, 1, 1)['backward'][0]
    backward_many = costmodel.cgdp_phases(many, hw, 1, 1)['backward'][0]
    assert backward_many == pytest.approx(backward_one)
    assert backward_one - 0.2 >= 2 * 4000 / hw.device_memory_bw
    assert costmodel.typical_closed_form(many, hw, 2) > \
        costmodel.typical_closed_form(one, hw, 2)
    # CPU replicas have no separate gather: their one copy is it.
    profile = cpu_profile()
    profile['layers'][0].update(param_bytes=4000, param_arrays=3)
    cpu = hardware.get_hardware('this-cpu', profile)
    work = costmodel.build_workload(profile, cpu, 1)
    assert costmodel.cgdp_gather_seconds(work, cpu, 3, 4000) == 0.0


def test_cgdp_chunk_calls_are_per_chunk():
    for arrays in (1, 7, 300):
        calls = costmodel.cgdp_chunk_calls(arrays)
        assert calls == costmodel.cgdp_chunk_calls(1)
        assert calls.copies == calls.host_calls == calls.gathers == 1
    # Nothing to copy, reduce or update in a chunk without parameters.
    empty = costmodel.cgdp_chunk_calls(0)
    assert empty.copies == empty.host_calls == empty.gathers == 0


def test_fair_speeds_max_min():
    caps = {'a': 1.0, 'b': 3.0}
    tasks = [costmodel.Task(0, 'x', 0, None, 0, 1, 0, None, {'a': 1.0}),
             costmodel.Task(1, 'x', 1, None, 0, 1, 0, None, {'a': 1.0,
                                                             'b': 1.0}),
             costmodel.Task(2, 'x', 2, None, 0, 1, 0, None, {'b': 1.0}),
             costmodel.Task(3, 'x', 3, None, 0, 1, 0, None, {})]
    costmodel.fair_speeds(tasks, caps)
    assert [t.speed for t in tasks] == pytest.approx([0.5, 0.5, 1.0, 1.0])


def cpu_profile(cores=1):
    """A measured-looking CPU profile: one stage of 1 s forward and 1 s
    backward, no parameters, free host operations."""
    return {'device': '@numpy', 'batch': 1, 'layers': [
        {'forward_s': 1.0, 'backward_s': 1.0, 'forward_1t_s': 1.0,
         'backward_1t_s': 1.0, 'param_bytes': 0, 'param_arrays': 0}],
        'copy': {'d2h_bytes_per_s': 1e9, 'h2d_bytes_per_s': 1e9},
        'host': {'threads': 1, 'ops': {op: {'per_array_s': 0.0,
                                            'per_byte_s': 0.0}
                                       for op in ('reduce2', 'reduce_slot',
                                                  'update', 'addgrads',
                                                  'copyparams')}},
        'chunk_overhead': {'forward_s': 0.0, 'backward_s': 0.0},
        'machine': {'cores': cores}}


def test_cpu_replicas_share_the_cores():
    # Two replicas that each keep one core busy, on one core: each runs at
    # half speed, so CGDP's compute takes twice as long as alone.
    profile = cpu_profile()
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.simulate_cgdp(work, hw, 1, 1).iteration_s == \
        pytest.approx(2.0)
    assert costmodel.simulate_cgdp(work, hw, 2, 1).iteration_s == \
        pytest.approx(4.0)
    assert costmodel.cgdp_closed_form(work, hw, 2, 1) == pytest.approx(4.0)
    # ParallelUpdater runs the replicas one after the other.
    assert costmodel.simulate_typical(work, hw, 3).iteration_s == \
        pytest.approx(6.0)


# ------------------------------------------------------------------ flops

# -------------------------------------------------------------------- GIL

def gil_profile(cores, gil_share, blas_rate=1e9):
    """cpu_profile on ``cores`` cores whose stage spends ``gil_share`` of
    its one-thread time outside BLAS: its FLOPs take the rest at
    ``blas_rate``."""
    profile = cpu_profile(cores)
    stage = profile['layers'][0]
    stage['forward_flops'] = (1.0 - gil_share) * blas_rate
    stage['backward_flops'] = (1.0 - gil_share) * blas_rate
    profile['machine']['blas_1t_flops'] = blas_rate
    return profile


def test_layer_gil_seconds():
    # 1 s on one thread, 2 GFLOP at 4 GFLOP/s: 0.5 s of arithmetic, 0.5 s
    # of Python; arithmetic beyond the measured time leaves none.
    assert costmodel.layer_gil_seconds(1.0, 2e9, 4e9) == pytest.approx(0.5)
    assert costmodel.layer_gil_seconds(0.1, 1e9, 4e9) == 0.0


def test_workload_gil_seconds_scale_with_the_batch():
    # Profiled at batch 1: 1 s per pass, 0.25 GFLOP per image at 1 GFLOP/s.
    # At batch 2 the pass takes 2 s, of which 0.5 s arithmetic.
    profile = gil_profile(cores=4, gil_share=0.75)
    hw = hardware.get_hardware('this-cpu', profile)
    work = costmodel.build_workload(profile, hw, 1)
    assert work.forward_gil_s == pytest.approx([0.75])
    assert work.backward_gil_s == pytest.approx([0.75])
    work = costmodel.build_workload(profile, hw, 2)
    assert work.forward_gil_s == pytest.approx([1.5])
    # Without the BLAS rate (an older profile) the GIL is not modelled.
    del profile['machine']['blas_1t_flops']
    assert costmodel.build_workload(profile, hw, 1).forward_gil_s is None


@pytest.mark.parametrize('n, expected', [(1, 2.0), (2, 3.0), (4, 6.0)])
def test_replicas_wait_for_the_gil(n, expected):
    # Four cores, so the cores never bind; each replica holds the GIL for
    # 0.75 of its 2 s pass. N thread workers need N x 0.75 of the GIL:
    # above 1 each runs at 1 / (N x 0.75) of its speed (N = 2: 3 s, N = 4:
    # 6 s). Process workers have an interpreter each: 2 s.
    profile = gil_profile(cores=4, gil_share=0.75)
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.simulate_cgdp(work, hw, n, 1, workers='thread'
                                   ).iteration_s == pytest.approx(expected)
    assert costmodel.cgdp_closed_form(work, hw, n, 1, workers='thread') == \
        pytest.approx(expected)
    assert costmodel.simulate_cgdp(work, hw, n, 1, workers='process'
                                   ).iteration_s == pytest.approx(2.0)
    assert costmodel.cgdp_closed_form(work, hw, n, 1, workers='process') \
        == pytest.approx(2.0)
    # ParallelUpdater's single thread never waits for it.
    assert costmodel.simulate_typical(work, hw, n).iteration_s == \
        pytest.approx(2.0 * n)
    # Without the GIL the four cores run up to four replicas at once.
    del profile['machine']['blas_1t_flops']
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.simulate_cgdp(work, hw, n, 1).iteration_s == \
        pytest.approx(2.0)


def test_measured_busy_cores_of_a_replica():
    # 1 s per pass with both cores, 1.5 s with one: Amdahl says 1.5 cores
    # busy; the profile measured 2 (BLAS's idle thread spins).
    profile = cpu_profile(cores=2)
    profile['layers'][0].update(forward_1t_s=1.5, backward_1t_s=1.5)
    hw = hardware.get_hardware('this-cpu', profile)
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.cpu_layer_times(work, hw, 2)[2] == pytest.approx(1.5)
    profile['whole'] = {'busy_cores': 2.0}
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.cpu_layer_times(work, hw, 2)[2] == pytest.approx(2.0)
    assert costmodel.cpu_layer_times(work, hw, 1) == (
        pytest.approx([1.5]), pytest.approx([1.5]), 1.0)
    # Four cores measured busy, two threads: halfway between 1 and 4
    # per thread: 1 + 3 x (2 - 1) / (4 - 1) = 2.
    four = hw.replace(cores=4, effective_cores=4.0)
    work.busy_cores = 4.0
    assert costmodel.cpu_layer_times(work, four, 2)[2] == pytest.approx(2.0)


def test_a_replica_alone_runs_at_its_measured_speed():
    # Profiled while other load left 1.5 cores' worth, the replica kept 2
    # busy: alone it still takes its measured 2 s (its times include the
    # load). Two one-thread replicas (3 s each) share the 1.5 cores: 4 s.
    profile = cpu_profile(cores=2)
    profile['layers'][0].update(forward_1t_s=1.5, backward_1t_s=1.5)
    profile['whole'] = {'busy_cores': 2.0}
    profile['machine']['effective_cores'] = 1.5
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    for method in (costmodel.simulate_typical, costmodel.simulate_cgdp):
        args = (work, hw, 1) if method is costmodel.simulate_typical \
            else (work, hw, 1, 1)
        assert method(*args).iteration_s == pytest.approx(2.0)
    assert costmodel.cgdp_closed_form(work, hw, 1, 1) == pytest.approx(2.0)
    assert costmodel.simulate_cgdp(work, hw, 2, 1).iteration_s == \
        pytest.approx(4.0)
    assert costmodel.cgdp_closed_form(work, hw, 2, 1) == pytest.approx(4.0)


@pytest.mark.parametrize('busy, expected', [(None, 4.125), (2.0, 4.25)])
def test_host_job_shares_the_cores_a_replica_keeps_busy(busy, expected):
    # One replica on two cores, two stages of 1 s forward and 1 s backward
    # (1.5 s each on one thread); the output stage's array costs a 0.5 s
    # update on one core. Forward 0-2, output backward 2-3; then the update
    # (1 core) and the input backward (Amdahl: 1.5 cores; measured: 2)
    # share the 2 cores at 2 / 2.5 = 0.8 (or 2 / 3) of full speed: the
    # update ends at 3.625 (3.75), the backward has 0.5 s left: 4.125
    # (4.25).
    profile = cpu_profile(cores=2)
    profile['layers'] = [dict(profile['layers'][0], forward_1t_s=1.5,
                              backward_1t_s=1.5, param_bytes=0,
                              param_arrays=0) for _ in range(2)]
    profile['layers'][1]['param_arrays'] = 1
    profile['host']['ops']['update'] = {'per_array_s': 0.5,
                                        'per_byte_s': 0.0}
    if busy is not None:
        profile['whole'] = {'busy_cores': busy}
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.simulate_cgdp(work, hw, 1, 1).iteration_s == \
        pytest.approx(expected)


def test_host_job_gil_seconds():
    # Per call: update 1 ms, mean of two slots 2 ms, a further slot 0.5 ms;
    # 3 devices, 10 ms per job. The chunk's 10 arrays are one flat slice:
    # one call of each.
    ops = {'update': {'per_array_s': 1e-3, 'per_byte_s': 1.0},
           'reduce2': {'per_array_s': 2e-3, 'per_byte_s': 1.0},
           'reduce_slot': {'per_array_s': 0.5e-3, 'per_byte_s': 1.0}}
    work = workload([1.0], [1.0], [100])
    work.host_ops = ops
    hw = make_hardware(host_chunk_overhead_s=0.01)
    calls = costmodel.cgdp_chunk_calls(10).host_calls
    assert costmodel.host_job_gil_seconds(work, hw, 3, 10) == \
        pytest.approx(0.01 + calls * (2e-3 + 0.5e-3) + calls * 1e-3)
    # One device lends its slot: no reduction.
    assert costmodel.host_job_gil_seconds(work, hw, 1, 10) == \
        pytest.approx(0.01 + calls * 1e-3)
    # Multi-node: the reduce job packs (one pass), the update job unpacks
    # and scales (two passes).
    assert costmodel.host_job_gil_seconds(work, hw, 3, 10, 'reduce') == \
        pytest.approx(0.01 + calls * (2e-3 + 0.5e-3 + 0.5e-3))
    assert costmodel.host_job_gil_seconds(work, hw, 3, 10, 'update') == \
        pytest.approx(calls * (1e-3 + 2 * 0.5e-3))
    # A preset: its Python per call (two for the mean of two slots, one
    # per further slot, the update rule's).
    work.host_ops = None
    op, update = hw.host_op_overhead_s, hw.host_update_overhead_s
    assert costmodel.host_job_gil_seconds(work, hw, 3, 10) == \
        pytest.approx(0.01 + calls * 3 * op + calls * update)


def test_host_job_and_replica_share_the_gil():
    # One replica, two all-Python stages of 1 s forward and 1 s backward on
    # four cores; the output stage's one parameter array costs a 0.5 s
    # update, all Python. Forward 0-2, output backward 2-3; then the update
    # and the input stage's backward share the GIL at half speed each: the
    # update ends at 4, the backward has 0.5 s left and ends at 4.5.
    # Without the GIL they overlap: 4.
    profile = cpu_profile(cores=4)
    profile['layers'] = [dict(profile['layers'][0], forward_flops=0.0,
                              backward_flops=0.0, param_bytes=0,
                              param_arrays=0) for _ in range(2)]
    profile['layers'][1].update(param_bytes=4, param_arrays=1)
    profile['host']['ops']['update'] = {'per_array_s': 0.5,
                                        'per_byte_s': 0.0}
    profile['machine']['blas_1t_flops'] = 1e9
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.simulate_cgdp(work, hw, 1, 1, workers='thread'
                                   ).iteration_s == pytest.approx(4.5)
    # A process worker has its own interpreter (and copies its gradients
    # and weights through shared memory, 4 bytes here).
    assert costmodel.simulate_cgdp(work, hw, 1, 1, workers='process'
                                   ).iteration_s == pytest.approx(4.0,
                                                                  rel=1e-3)
    del profile['machine']['blas_1t_flops']
    work = costmodel.build_workload(profile, hw, 1)
    assert costmodel.simulate_cgdp(work, hw, 1, 1, workers='thread'
                                   ).iteration_s == pytest.approx(4.0)


class ConvLinear(chainer.Chain):
    """conv 3->4 (3x3, pad 1) + relu | conv 4->6 (3x3, stride 2, groups 2)
    | linear 6*4*4 -> 10; three layers."""

    def __init__(self):
        super(ConvLinear, self).__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 4, 3, pad=1)
            self.c2 = L.Convolution2D(4, 6, 3, stride=2, pad=1, groups=2,
                                      nobias=True)
            self.fc = L.Linear(6 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.c2(F.relu(self.c1(x))))


def _costs_of(forward, *inputs):
    return functions.count_forward(lambda: forward(*inputs),
                                   no_grad_inputs=inputs[:1])


def test_flops_and_bytes_of_a_convolution_and_a_linear():
    x = numpy.ones((2, 3, 8, 8), dtype=numpy.float32)
    conv = L.Convolution2D(3, 4, 3, pad=1)
    cost, = _costs_of(conv, x)
    # 2 x K x K x Cin x Cout x Hout x Wout per image, 2 images.
    assert cost.kind == 'matmul'
    assert cost.flops == 2 * (2 * 3 * 3 * 3 * 4 * 8 * 8)
    assert cost.bytes_read == 4 * (2 * 3 * 8 * 8 + 4 * 3 * 3 * 3 + 4)
    assert cost.bytes_written == 4 * 2 * 4 * 8 * 8
    assert cost.param_bytes == 4 * (4 * 3 * 3 * 3 + 4)
    # The network input needs no gradient: the weight gradient only.
    assert cost.backward_flops == cost.flops
    h = numpy.ones((5, 7), dtype=numpy.float32)
    linear = L.Linear(7, 3)
    cost, = functions.count_forward(lambda: linear(h))
    assert cost.flops == 2 * 5 * 7 * 3
    assert cost.bytes_read == 4 * (5 * 7 + 3 * 7 + 3)
    assert cost.bytes_written == 4 * 5 * 3
    assert cost.backward_flops == 2 * cost.flops  # both gradients


def test_flops_and_bytes_of_a_grouped_strided_convolution_and_deconv():
    x = numpy.ones((1, 4, 8, 8), dtype=numpy.float32)
    conv = L.Convolution2D(4, 6, 3, stride=2, pad=1, groups=2, nobias=True)
    cost, = _costs_of(conv, x)
    # 6 x 4 x 4 outputs x (4 / 2 groups) x 3 x 3 multiply-adds.
    assert cost.flops == 2 * 6 * 4 * 4 * 2 * 3 * 3
    deconv = L.Deconvolution2D(3, 5, 4, stride=2, pad=1)
    cost, = _costs_of(deconv, numpy.ones((1, 3, 6, 6), numpy.float32))
    # Every input element is spread over 5 channels x 4 x 4 weights.
    assert cost.flops == 2 * 3 * 6 * 6 * 5 * 4 * 4


def test_flops_and_bytes_of_batch_normalization_and_concat():
    x = numpy.ones((2, 3, 4, 4), dtype=numpy.float32)
    bn = L.BatchNormalization(3)
    cost, = functions.count_forward(lambda: bn(x))
    elements = 2 * 3 * 4 * 4
    # Training: mean and variance (3 per element) and the normalized,
    # scaled, shifted output (4 per element).
    assert cost.kind == 'normalization'
    assert cost.flops == 7 * elements
    assert cost.bytes_read == 4 * (elements + 3 + 3)
    assert cost.bytes_written == 4 * elements
    a = numpy.ones((2, 3), dtype=numpy.float32)
    b = numpy.ones((2, 5), dtype=numpy.float32)
    cost, = functions.count_forward(lambda: F.concat((a, b), axis=1))
    assert cost.kind == 'layout'
    assert cost.flops == 0
    assert cost.bytes_read == 4 * (6 + 10)
    assert cost.bytes_written == 4 * 16


@pytest.mark.slow
@pytest.mark.parametrize('net', ['alexnet', 'googlenet', 'vgg16',
                                 'resnet152'])
def test_matrix_product_flops_of_the_four_networks(net):
    # The textbook count from each layer's shapes: 2 x K x K x Cin/groups
    # x Cout x Hout x Wout per convolution, 2 x in x out per linear layer;
    # the shapes come from a LinkHook, the hook's totals from the
    # functions it saw.
    import models
    model = models.Classifier(models.get_model(net, n_classes=10, seed=0))
    x = numpy.zeros((1, 3, 64, 64), dtype=numpy.float32)
    t = numpy.zeros(1, dtype=numpy.int32)
    expected = []

    class Shapes(chainer.LinkHook):
        name = 'Shapes'

        def forward_postprocess(self, args):
            link, out = args.link, args.out
            if isinstance(link, L.Convolution2D):
                kh, kw = link.ksize if isinstance(link.ksize, tuple) \
                    else (link.ksize, link.ksize)
                cin = link.W.shape[1]
                expected.append(2 * kh * kw * cin * out.size)
            elif isinstance(link, L.Linear):
                expected.append(2 * link.W.size * out.shape[0])
    hook = Shapes()
    with hook:
        costs = functions.count_forward(lambda: model(x, t),
                                        no_grad_inputs=(x,))
    counted = functions.totals(costs, ('matmul',))['flops']
    assert counted == pytest.approx(sum(expected), rel=0.01)
    assert sum(1 for c in costs if c.kind == 'other') == 0


def test_flops_profile_predicts():
    model = ConvLinear()
    profile = {'layers': layers.cached_layer_costs(model, 8, n_classes=10),
               'batch': 1}
    result = costmodel.predict(profile, 'minsky', 2, 16)
    assert set(result) >= {'t_typical', 't_cgdp', 'speedup', 'eff_typical',
                           'eff_cgdp', 'best_chunk_size'}
    assert 1 <= result['best_chunk_size'] <= 3
    single = costmodel.predict(profile, 'minsky', 1, 16)
    assert single['eff_typical'] == pytest.approx(1.0)
    assert single['eff_cgdp'] == pytest.approx(1.0)


# ---------------------------------------------------------------- profiles

def test_profile_model_and_choose_chunk_size():
    from experiments import profile as profile_module
    target = L.Classifier(ConvLinear())
    profile = profile_module.profile_model(target, '@numpy', 2, 8, reps=1,
                                           n_classes=10)
    assert len(profile['layers']) == 3
    assert all(s['forward_s'] >= 0 and s['backward_s'] >= 0
               for s in profile['layers'])
    assert sum(s['param_bytes'] for s in profile['layers']) == sum(
        p.array.nbytes for p in target.params())
    assert profile['copy']['d2h_bytes_per_s'] > 0
    assert set(profile['host']['ops']) == {
        'reduce2', 'reduce_slot', 'update', 'addgrads', 'copyparams'}
    assert set(profile['host']['update_rules']) == {'momentum_sgd', 'adam'}
    assert set(profile['host']['fused']) == {'momentum_sgd', 'adam'}
    assert [s['forward_calls'] for s in profile['layers']][:2] == [2, 1]
    assert profile['machine']['function_call']['forward_s'] > 0
    # One thread's matrix-product rate: a real CPU does GFLOP/s; the
    # replica keeps at least part of a core busy.
    assert profile['machine']['blas_1t_flops'] > 1e8
    assert 0 < profile['whole']['busy_cores'] <= profile['machine'][
        'cpu_count'] + 0.5
    work = costmodel.build_workload(
        profile, hardware.get_hardware('this-cpu', profile), 2)
    assert len(work.forward_gil_s) == 3
    assert all(0 <= g <= t for g, t in zip(work.forward_gil_s,
                                            work.forward_1t_s))
    size = costmodel.choose_chunk_size(profile, 2)
    assert 1 <= size <= 3
    assert costmodel.choose_chunk_size(profile, 2, 'minsky') in (1, 2, 3)


# --------------------------------------------------------------- bad input

def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match='minsky.*pcie3.*h100-pcie5.*gh200'):
        hardware.get_hardware('dgx')


def test_this_cpu_needs_a_profile():
    with pytest.raises(ValueError, match='profile'):
        hardware.get_hardware('this-cpu')


@pytest.mark.parametrize('n', [0, -1, 1.5, True])
def test_bad_device_count(n):
    work = workload([1.0], [1.0], [1])
    with pytest.raises(ValueError, match='n_devices'):
        costmodel.simulate_cgdp(work, make_hardware(), n, 1)


@pytest.mark.parametrize('field', ['host_link_bw', 'peer_bw',
                                   'host_memory_bw', 'copy_engine_bw'])
def test_negative_bandwidth(field):
    with pytest.raises(ValueError, match=field):
        make_hardware(**{field: -1.0})


def test_bad_chunk_size_and_batch():
    work = workload([1.0, 1.0], [1.0, 1.0], [1, 1])
    with pytest.raises(ValueError, match='1 to 2'):
        costmodel.simulate_cgdp(work, make_hardware(), 1, 3)
    profile = {'layers': [{'forward_flops': 1.0, 'backward_flops': 1.0,
                           'param_bytes': 4}]}
    with pytest.raises(ValueError, match='batch'):
        costmodel.predict(profile, 'minsky', 1, 0)
    with pytest.raises(ValueError, match='layers'):
        costmodel.predict({'layers': []}, 'minsky', 1, 1)


def test_bad_peer_scope_lists_the_scopes():
    with pytest.raises(ValueError, match='none, socket, all, pcie'):
        make_hardware(peer_scope='mesh')


def pipeline_profile(overhead_s):
    """A four-stage CPU profile whose host update (0.4 s per stage) hides
    behind the backward of earlier chunks when chunks are small, and whose
    chunks each cost ``overhead_s`` more; two cores, so that a host job
    runs beside the replica."""
    profile = cpu_profile(cores=2)
    stage = dict(profile['layers'][0], param_bytes=4, param_arrays=1)
    profile['layers'] = [dict(stage) for _ in range(4)]
    profile['host']['ops']['update'] = {'per_array_s': 0.4,
                                        'per_byte_s': 0.0}
    profile['chunk_overhead'] = {'forward_s': overhead_s,
                                 'backward_s': overhead_s}
    profile['hardware'] = 'this-cpu'
    return profile


def test_model_chunk_chooser_follows_the_profile():
    # Free chunks: one stage per chunk hides three of the four updates.
    # Chunks that cost 1 s each: one chunk of all four stages.
    chooser = costmodel.ModelChunkChooser()
    assert chooser.choose_from_profile(pipeline_profile(0.0), 1) == 1
    assert chooser.choice == 1
    assert chooser.predicted[1] == min(chooser.predicted.values())
    assert chooser.predicted[4] > chooser.predicted[1]
    assert chooser.choose_from_profile(pipeline_profile(1.0), 1) == 4
    assert chooser.choice == 4
    with pytest.raises(ValueError, match='workers'):
        chooser.choose_from_profile(pipeline_profile(0.0), 1, 'fork')
    with pytest.raises(ValueError, match='hardware'):
        costmodel.ModelChunkChooser(hardware='dgx')


class _PlainNet(chainer.Chain):
    """A model without stages: a convolution and three linear layers."""

    def __init__(self):
        super(_PlainNet, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 4, 3, pad=1)
            self.l1 = L.Linear(None, 16)
            self.l2 = L.Linear(16, 16)
            self.l3 = L.Linear(16, 5)

    def forward(self, x):
        h = F.relu(self.conv(x))
        return self.l3(F.relu(self.l2(F.relu(self.l1(h)))))


def test_updater_runs_the_chunk_size_the_chooser_recorded():
    # CGDPUpdater(chunk_size=chooser) profiles replica 0 on its share of
    # the first batch through the chooser, then trains at its choice, on
    # a model without stages.
    from cgdp_chainer import CGDPUpdater
    model = L.Classifier(_PlainNet())
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01)
    optimizer.setup(model)
    rng = numpy.random.RandomState(0)
    data = [(rng.rand(3, 6, 6).astype(numpy.float32), numpy.int32(i % 5))
            for i in range(16)]
    iterator = chainer.iterators.SerialIterator(data, 8, shuffle=False)
    chooser = costmodel.ModelChunkChooser(reps=1)
    updater = CGDPUpdater(iterator, optimizer, ['@numpy', '@numpy'],
                          chunk_size=chooser, workers='thread')
    try:
        updater.update()
        assert chooser.profile is not None
        # One record per layer, input side first: the reverse of the
        # runtime's ready order.
        assert [r['name'] for r in chooser.profile['layers']] == [
            '/predictor/conv', '/predictor/l1', '/predictor/l2',
            '/predictor/l3']
        assert len(chooser.profile['layers']) == updater.n_layers
        assert chooser.profile['batch'] == 4  # device 0's share
        # Only the optimizer the updater runs is measured.
        assert set(chooser.profile['host']['update_rules']) == {
            'momentum_sgd'}
        assert updater.chunk_size == chooser.choice
        assert chooser.predicted[chooser.choice] == min(
            chooser.predicted.values())
        expected = costmodel.plan_chunks(
            [r['param_bytes'] for r in chooser.profile['layers']],
            chooser.choice)
        assert updater.chunk_plan.n_chunks == len(expected)
        updater.update()
    finally:
        updater.finalize()


def test_chunk_size_model_trains_a_model_without_stages():
    from cgdp_chainer import CGDPUpdater
    model = L.Classifier(_PlainNet())
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01)
    optimizer.setup(model)
    rng = numpy.random.RandomState(1)
    data = [(rng.rand(3, 6, 6).astype(numpy.float32), numpy.int32(i % 5))
            for i in range(16)]
    iterator = chainer.iterators.SerialIterator(data, 8, shuffle=False)
    updater = CGDPUpdater(iterator, optimizer, ['@numpy', '@numpy'],
                          chunk_size='model', workers='thread')
    try:
        before = model.predictor.l2.W.array.copy()
        updater.update()
        updater.update()
        assert 1 <= updater.chunk_size <= updater.n_layers
        assert not numpy.array_equal(before, model.predictor.l2.W.array)
    finally:
        updater.finalize()


def test_plan_chunks_forms_the_runtimes_chunks():
    # Layers input side first; the runtime groups from the output end.
    from cgdp_chainer.runtime.replica import readiness
    sizes = [400, 100, 300, 200, 100]
    order = ['/l{}/W'.format(i) for i in reversed(range(len(sizes)))]
    nbytes = {'/l{}/W'.format(i): b for i, b in enumerate(sizes)}
    for chunking, kwargs in (
            (2, {'chunk_size': 2}), (('bytes', 300), {'chunk_bytes': 300}),
            (('bytes', 1), {'chunk_bytes': 1})):
        plan = readiness.ChunkPlan.from_ready_order(order, nbytes=nbytes,
                                                    **kwargs)
        runtime = sorted(
            sorted(int(path[2:]) for path in layers)
            for layers in plan.layers)
        model = [list(range(a, b)) for a, b in costmodel.plan_chunks(
            sizes, chunking)]
        assert model == runtime
    with pytest.raises(ValueError, match='bytes'):
        costmodel.plan_chunks(sizes, ('bytes', 0))


def test_validation_points_and_prediction_rows():
    from experiments import costmodel_predict
    from experiments import validate_model
    summary = [{'mode': 'typical', 'n_devices': 2, 'n_ranks': 1,
                'batch_per_device': 1, 'image_size': 8, 'median_s': 5.0,
                'iqr_s': 0.1},
               {'mode': 'cgdp', 'n_devices': 2, 'n_ranks': 1,
                'batch_per_device': 1, 'image_size': 8, 'median_s': 4.0,
                'iqr_s': 0.1}]
    rows = validate_model.predict_points(cpu_profile(), summary, {2: 1})
    # typical: two replicas one after the other, 2 s each (plus the host
    # job overhead); cgdp: both at half speed on one core.
    assert rows[0]['predicted_s'] == pytest.approx(4.0)
    assert rows[0]['error'] == pytest.approx(4.0 / 5.0 - 1.0)
    assert rows[1]['predicted_s'] == pytest.approx(4.0, rel=1e-3)
    # A run at the runtime's default chunks is predicted at those chunks.
    default = validate_model.predict_points(cpu_profile(), summary, {2: None})
    assert default[1]['chunk_size'] == 'chunk_bytes={}'.format(1024 * 1024)
    assert 'typical' in validate_model.format_table(rows)
    assert 'GIL (75%' in validate_model.describe_profile(
        gil_profile(cores=1, gil_share=0.75), 1)

    profile = {'layers': layers.cached_layer_costs(ConvLinear(), 8,
                                                   n_classes=10),
               'batch': 1}
    predictions = costmodel_predict.predict_rows(
        'convlinear', profile, 'pcie3', counts=(1, 2), batches=(16,))
    # The pay-off table: one line per device count above 1 (the runtime's
    # default worker kind and optimizer), with the chunking to use.
    table = costmodel_predict.payoff_table(predictions, batch=16).splitlines()
    assert len(table) == 2
    best = [r for r in predictions if r['workers'] == 'process' and
            r['optimizer'] == 'momentum_sgd' and r['n_devices'] == 2][0]
    assert table[1].split()[:3] == ['convlinear', 'pcie3', '2']
    assert table[1].endswith('chunk_size={}'.format(best['best_chunk_size']))
    # Both worker kinds and both optimizers, each at N = 1 and 2.
    assert len(predictions) == 8
    assert {(r['workers'], r['optimizer']) for r in predictions} == {
        (w, o) for w in ('process', 'thread')
        for o in ('momentum_sgd', 'adam')}
    assert set(predictions[0]) == set(costmodel_predict.COLUMNS)
    for row in predictions:
        assert row['speedup_vs_nccl'] == pytest.approx(
            row['t_nccl'] / row['t_cgdp'], rel=1e-5)
    cpu_rows = costmodel_predict.predict_rows(
        'one', cpu_profile(), 'this-cpu', counts=(1, 2), batches=(1,),
        optimizers=costmodel_predict.measured_optimizers(cpu_profile()))
    assert {r['optimizer'] for r in cpu_rows} == {'momentum_sgd'}
    assert all(r['t_nccl'] is None for r in cpu_rows)
    # No NCCL on CPU replicas: the pay-off table says so.
    line = costmodel_predict.payoff_table(cpu_rows, batch=1).splitlines()[1]
    assert line.split()[4] == '-' and line.split()[7] == '-'


def test_validation_refuses_a_summary_with_only_multi_rank_rows(tmp_path,
                                                                capsys):
    from experiments import results
    from experiments import validate_model
    path = tmp_path / 'summary.csv'
    row = {'mode': 'cgdp', 'n_devices': 1, 'n_ranks': 2,
           'batch_per_device': 4, 'image_size': 64, 'median_s': 1.0,
           'iqr_s': 0.1, 'throughput': 8.0, 'efficiency': None,
           'speedup_vs_typical': None}
    results.write_csv(str(path), results.SUMMARY_COLUMNS, [row])
    with pytest.raises(SystemExit) as info:
        validate_model.main(['--net', 'alexnet', '--summary', str(path)])
    assert info.value.code == 2
    assert 'single-process' in capsys.readouterr().err


# ------------------------------------------------------------- multi-node

def make_network(bandwidth=50.0, latency_s=0.1):
    return hardware.Network(name='test-net', description='hand-computable',
                            bandwidth=bandwidth, latency_s=latency_s)


def both_multinode(work, hw, n, chunk_size, n_nodes, network):
    """Simulated and closed-form multi-node CGDP seconds."""
    simulated = costmodel.simulate_cgdp(work, hw, n, chunk_size,
                                        n_nodes=n_nodes,
                                        network=network).iteration_s
    closed = costmodel.cgdp_closed_form(work, hw, n, chunk_size,
                                        n_nodes=n_nodes, network=network)
    return simulated, closed


def test_ring_allreduce_formula():
    # 2 (R - 1) / R x bytes / bandwidth + 2 (R - 1) x latency.
    net = make_network(bandwidth=100.0, latency_s=0.01)
    assert costmodel.ring_allreduce_seconds(1000, 4, net) == \
        pytest.approx(1.5 * 1000 / 100.0 + 6 * 0.01)
    assert costmodel.ring_allreduce_seconds(1000, 2, net) == \
        pytest.approx(1000 / 100.0 + 2 * 0.01)
    assert costmodel.ring_allreduce_seconds(1000, 1, net) == 0.0
    assert costmodel.ring_allreduce_seconds(0, 8, net) == 0.0


def test_multinode_one_chunk_exposes_the_ring_allreduce():
    # One chunk, free host work: the all-reduce runs after the whole
    # backward and before the update, so it adds exactly its ring time.
    work = workload([1, 2], [2, 4], [100, 300])
    hw = make_hardware()
    net = make_network(bandwidth=50.0, latency_s=0.1)
    for n in (1, 2):
        single = costmodel.simulate_cgdp(work, hw, n, 2).iteration_s
        assert single == pytest.approx(3 + 6 + 4 + 4)
        for n_nodes, ring in ((2, 400 / 50.0 + 0.2), (4, 12.0 + 0.6),
                              (8, 14.0 + 1.4)):
            simulated, closed = both_multinode(work, hw, n, 2, n_nodes, net)
            assert simulated - single == pytest.approx(ring)
            assert closed == pytest.approx(simulated)
    # With host costs (2000 B/s): the reduce packs (2 bytes per byte; with
    # two devices it reads both slots and writes the sum first: 3 more),
    # the update unpacks, scales and runs MomentumSGD (2 + 2 + 5).
    hw = make_hardware(host_thread_bw=2000.0)
    for n, reduce_s in ((1, 800 / 2000.0), (2, 2000 / 2000.0)):
        simulated, closed = both_multinode(work, hw, n, 2, 4, net)
        expected = 3 + 6 + 4 + reduce_s + 12.6 + 3600 / 2000.0 + 4
        assert simulated == pytest.approx(expected)
        assert closed == pytest.approx(expected)


def test_multinode_small_chunks_on_a_slow_network_are_network_bound():
    # Eight chunks of 100 bytes; fast copies (1e-4 s), free host work, a
    # slow network: each chunk's all-reduce (10 s + 2 x 0.01 s) waits for
    # the one before, so the iteration is F + the first backward + its d2h
    # + every all-reduce + the last h2d.
    work = workload([0.01] * 8, [0.01] * 8, [100] * 8)
    hw = make_hardware(host_link_bw=1e6, copy_engine_bw=1e6)
    net = make_network(bandwidth=10.0, latency_s=0.01)
    ring = costmodel.ring_allreduce_seconds(100, 2, net)
    assert ring == pytest.approx(10.02)
    simulated, closed = both_multinode(work, hw, 1, 1, 2, net)
    expected = 0.08 + 0.01 + 1e-4 + 8 * ring + 1e-4
    assert simulated == pytest.approx(expected)
    assert closed == pytest.approx(expected)
    assert simulated / (8 * ring) == pytest.approx(1.0, rel=2e-3)
    # Latency makes small chunks cost more: one chunk sends the same bytes
    # in one all-reduce.
    slow_start = make_network(bandwidth=10.0, latency_s=0.5)
    many, _ = both_multinode(work, hw, 1, 1, 2, slow_start)
    one, _ = both_multinode(work, hw, 1, 8, 2, slow_start)
    assert many == pytest.approx(0.09 + 1e-4 + 8 * (10 + 1.0) + 1e-4)
    assert one == pytest.approx(0.16 + 8e-4 + (80 + 1.0) + 8e-4)
    assert one < many


def test_multinode_fast_network_hides_behind_the_backward():
    # Each chunk's all-reduce (0.189 s on 8 nodes) ends before the next
    # chunk's backward (1 s): only the input-side chunk's is exposed.
    # ChainerMN exposes the all-reduce of the whole model.
    work = workload([0.1] * 4, [1.0] * 4, [100] * 4)
    hw = make_hardware(host_link_bw=1e4, copy_engine_bw=1e4)
    net = make_network(bandwidth=1e3, latency_s=1e-3)
    ring = costmodel.ring_allreduce_seconds(100, 8, net)
    assert ring == pytest.approx(0.175 + 0.014)
    single = costmodel.simulate_cgdp(work, hw, 2, 1).iteration_s
    assert single == pytest.approx(0.4 + 4.0 + 0.01 + 0.01)
    simulated, closed = both_multinode(work, hw, 2, 1, 8, net)
    assert simulated == pytest.approx(single + ring)
    assert closed == pytest.approx(simulated)
    typical = costmodel.simulate_typical(work, hw, 2).iteration_s
    chainermn = costmodel.simulate_chainermn(work, hw, 2, 8, net)
    assert chainermn.iteration_s == pytest.approx(
        typical + costmodel.ring_allreduce_seconds(400, 8, net))


def test_chainermn_hand_computed():
    # As test_typical_hand_computed (5 s on one node), plus the ring
    # all-reduce of 100 bytes between the local sum and the update.
    work = workload([1.0], [2.0], [100])
    hw = make_hardware()
    net = make_network(bandwidth=50.0, latency_s=0.25)
    for n, n_nodes, expected in ((2, 2, 5.0 + 2.0 + 0.5),
                                 (2, 4, 5.0 + 3.0 + 1.5),
                                 (1, 2, 3.0 + 2.0 + 0.5)):
        simulated = costmodel.simulate_chainermn(work, hw, n, n_nodes, net)
        assert simulated.iteration_s == pytest.approx(expected)
        assert costmodel.chainermn_closed_form(work, hw, n, n_nodes, net) \
            == pytest.approx(expected)


def test_one_node_is_the_single_node_model():
    # R = 1 sends nothing over the network, however slow it is.
    rng = numpy.random.RandomState(3)
    work = workload(rng.uniform(0.01, 0.2, 5), rng.uniform(0.02, 0.4, 5),
                    [int(b) for b in rng.randint(0, 4000, 5)],
                    [int(a) for a in rng.randint(0, 5, 5)])
    hw = make_hardware(copy_latency_s=1e-3, host_thread_bw=2e4,
                       host_link_bw=2e4, copy_engine_bw=2e4,
                       host_chunk_overhead_s=1e-3)
    crawl = make_network(bandwidth=1e-3, latency_s=10.0)
    for n in (1, 3):
        for size in (1, 2, 5):
            assert costmodel.simulate_cgdp(
                work, hw, n, size, n_nodes=1, network=crawl).iteration_s == \
                costmodel.simulate_cgdp(work, hw, n, size).iteration_s
            assert costmodel.cgdp_closed_form(
                work, hw, n, size, n_nodes=1, network=crawl) == \
                costmodel.cgdp_closed_form(work, hw, n, size)
        assert costmodel.simulate_chainermn(
            work, hw, n, 1, crawl).iteration_s == \
            costmodel.simulate_typical(work, hw, n).iteration_s
        assert costmodel.chainermn_closed_form(work, hw, n, 1, crawl) == \
            costmodel.typical_closed_form(work, hw, n)
    # And through predict_multinode on a preset with a FLOPs profile.
    profile = {'layers': layers.cached_layer_costs(ConvLinear(), 8,
                                                   n_classes=10),
               'batch': 1}
    single = None
    for n in (1, 2, 4):
        multi = costmodel.predict_multinode(profile, 'minsky', 'ib-edr', 1,
                                            n, 16)
        plain = costmodel.predict(profile, 'minsky', n, 16, single=single)
        single = single or plain
        assert multi['t_chainermn'] == plain['t_typical']
        assert multi['t_cgdp'] == plain['t_cgdp']
        assert multi['best_chunk_size'] == plain['best_chunk_size']
        assert multi['eff_chainermn'] == pytest.approx(plain['eff_typical'])
        assert multi['eff_cgdp'] == pytest.approx(plain['eff_cgdp'])
        assert multi['allreduce_s'] == 0.0


@pytest.mark.parametrize('n', [1, 3])
@pytest.mark.parametrize('chunk_size', [1, 3, 7])
@pytest.mark.parametrize('n_nodes', [2, 5])
def test_multinode_closed_form_matches_simulation(n, chunk_size, n_nodes):
    # One host thread (as the GPU presets): reduces and updates of
    # different chunks interleave on it; no host-memory contention.
    rng = numpy.random.RandomState(100 * n + 10 * chunk_size + n_nodes)
    stages = 7
    work = workload(rng.uniform(0.01, 0.2, stages),
                    rng.uniform(0.02, 0.4, stages),
                    [int(b) for b in rng.randint(0, 4000, stages)],
                    [int(a) for a in rng.randint(0, 5, stages)])
    hw = make_hardware(copy_latency_s=1e-3, host_thread_bw=2e4,
                       host_update_overhead_s=1e-3, host_link_bw=2e4,
                       copy_engine_bw=2e4, host_chunk_overhead_s=1e-3,
                       chunk_overhead_s=0.03, device_memory_bw=1e5,
                       device_array_overhead_s=1e-3)
    net = make_network(bandwidth=rng.uniform(5e3, 5e4),
                       latency_s=rng.uniform(0, 5e-3))
    simulated, closed = both_multinode(work, hw, n, chunk_size, n_nodes,
                                       net)
    assert closed == pytest.approx(simulated, rel=1e-9)
    assert costmodel.chainermn_closed_form(work, hw, n, n_nodes, net) == \
        pytest.approx(costmodel.simulate_chainermn(
            work, hw, n, n_nodes, net).iteration_s, rel=1e-9)


def test_multinode_presets_closed_form_close_to_simulation():
    work = workload([0.01] * 10, [0.02] * 10, [4_000_000] * 10, [2] * 10)
    for name in ('minsky', 'h100-pcie5'):
        hw = hardware.get_hardware(name)
        for network in ('ib-edr', 'ib-hdr'):
            simulated, closed = both_multinode(work, hw, 4, 2, 4, network)
            assert closed == pytest.approx(simulated, rel=0.25)


def test_network_presets_are_documented():
    assert set(hardware.NETWORK_PRESETS) == {'ib-edr', 'ib-hdr'}
    edr = hardware.get_network('ib-edr')
    hdr = hardware.get_network('ib-hdr')
    assert edr.bandwidth == pytest.approx(12.5e9)   # 100 Gb/s
    assert hdr.bandwidth == pytest.approx(25e9)     # 200 Gb/s
    for net in (edr, hdr):
        assert 0 < net.latency_s < 1e-5 and net.sources
    assert hardware.get_network(edr) is edr


@pytest.mark.parametrize('changes, field', [
    ({'bandwidth': 0.0}, 'bandwidth'), ({'bandwidth': -1.0}, 'bandwidth'),
    ({'bandwidth': float('nan')}, 'bandwidth'),
    ({'bandwidth': float('inf')}, 'bandwidth'),
    ({'bandwidth': '12.5e9'}, 'bandwidth'),
    ({'latency_s': -1e-6}, 'latency_s'),
    ({'latency_s': float('nan')}, 'latency_s')])
def test_bad_network_values(changes, field):
    with pytest.raises(ValueError, match=field):
        make_network().replace(**changes)


def test_bad_network_and_node_count():
    with pytest.raises(ValueError, match='ib-edr, ib-hdr'):
        hardware.get_network('10gbe')
    with pytest.raises(ValueError, match='ib-edr, ib-hdr'):
        hardware.get_network(12.5e9)
    profile = {'layers': [{'forward_flops': 1.0, 'backward_flops': 1.0,
                           'param_bytes': 4}]}
    with pytest.raises(ValueError, match='unknown network'):
        costmodel.predict_multinode(profile, 'minsky', 'omnipath', 2, 4, 1)
    work = workload([1.0], [1.0], [1])
    for n_nodes in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match='n_nodes'):
            costmodel.simulate_cgdp(work, make_hardware(), 1, 1,
                                    n_nodes=n_nodes)
        with pytest.raises(ValueError, match='n_nodes'):
            costmodel.simulate_chainermn(work, make_hardware(), 1, n_nodes)
        with pytest.raises(ValueError, match='n_nodes'):
            costmodel.predict_multinode(profile, 'minsky', 'ib-edr', n_nodes,
                                        4, 1)


def test_multinode_prediction_rows():
    from experiments import costmodel_predict
    profile = {'layers': layers.cached_layer_costs(ConvLinear(), 8,
                                                   n_classes=10),
               'batch': 1}
    rows = costmodel_predict.predict_multinode_rows(
        'convlinear', profile, 'minsky', 'ib-edr', node_counts=(1, 2))
    assert [r['n_nodes'] for r in rows] == [1, 2]
    assert set(rows[0]) == set(costmodel_predict.MULTINODE_COLUMNS)
    assert rows[1]['t_chainermn'] > rows[0]['t_chainermn']
    assert rows[0]['devices_per_node'] == 4 and rows[0]['network'] == 'ib-edr'


# ------------------------------------------------- the NCCL baseline

def test_nccl_hand_computed():
    # F = 1, B = 2, 100 bytes. Free packing: the ring reduce moves 100
    # bytes over every hop at once at 100 B/s (1 s), the broadcast too:
    # 3 + 1 + 1 = 5 s for 2 and for 4 devices; 3 s for one (no NCCL).
    work = workload([1.0], [2.0], [100])
    hw = make_hardware()
    for n, expected in ((1, 3.0), (2, 5.0), (4, 5.0)):
        assert costmodel.nccl_closed_form(work, hw, n) == \
            pytest.approx(expected)
        assert costmodel.simulate_nccl(work, hw, n).iteration_s == \
            pytest.approx(expected)
    # Packing at 100 B/s costs 2 s per pass (read + write), four passes
    # (gather and scatter of the gradients and of the parameters); the
    # update 5 s (MomentumSGD: 5 bytes per byte) or 7 s (Adam).
    hw = make_hardware(device_memory_bw=100.0)
    assert costmodel.nccl_closed_form(work, hw, 2) == pytest.approx(
        3.0 + 4 * 2.0 + 1.0 + 5.0 + 1.0)
    assert costmodel.simulate_nccl(work, hw, 2).iteration_s == \
        pytest.approx(18.0)
    work.optimizer = 'adam'
    assert costmodel.simulate_nccl(work, hw, 2).iteration_s == \
        pytest.approx(20.0)
    assert costmodel.nccl_closed_form(work, hw, 1) == pytest.approx(10.0)


def test_nccl_ring_crosses_the_sockets_through_the_host():
    # Two devices per socket with NVLink between them; 1 -> 2 and 3 -> 0
    # are staged through host memory over 50 B/s links: the ring runs at
    # 50 B/s, 2 s per collective. Two devices stay on one socket: 1 s.
    work = workload([1.0], [2.0], [100])
    hw = make_hardware(devices_per_socket=2, peer_scope='socket',
                       host_link_bw=50.0)
    assert costmodel.ring_hops(4, 0, 'reduce') == [(1, 2), (2, 3), (3, 0)]
    assert costmodel.ring_hops(4, 0, 'bcast') == [(0, 1), (1, 2), (2, 3)]
    phases = costmodel.nccl_phases(work, hw, 4)
    assert phases['reduce'] == pytest.approx(2.0)
    assert phases['bcast'] == pytest.approx(2.0)
    assert costmodel.simulate_nccl(work, hw, 4).iteration_s == \
        pytest.approx(7.0)
    assert costmodel.nccl_closed_form(work, hw, 2) == pytest.approx(5.0)


def test_nccl_needs_a_gpu_preset():
    hw = hardware.get_hardware('this-cpu', cpu_profile())
    work = costmodel.build_workload(cpu_profile(), hw, 1)
    with pytest.raises(ValueError, match='NCCL.*GPU preset'):
        costmodel.simulate_nccl(work, hw, 2)
    result = costmodel.predict(cpu_profile(), hw, 2, 1)
    assert result['t_nccl'] is None and result['speedup_vs_nccl'] is None


def test_predictions_include_both_baselines():
    model = ConvLinear()
    profile = {'layers': layers.cached_layer_costs(model, 8, n_classes=10),
               'batch': 1}
    result = costmodel.predict(profile, 'minsky', 4, 16)
    assert result['speedup_vs_nccl'] == pytest.approx(
        result['t_nccl'] / result['t_cgdp'])
    assert result['t_nccl_closed'] > 0
    assert 0 < result['eff_nccl'] <= 1.0 + 1e-9


# ---------------------------------------------- worker kinds on GPUs

def launch_workload():
    """F = 1 s and B = 2 s per replica, of which 0.75 s and 1.5 s are its
    host-side time (held in its interpreter); no parameters."""
    work = workload([1.0], [2.0], [0], [0])
    work.forward_gil_s = [0.75]
    work.backward_gil_s = [1.5]
    return work


@pytest.mark.parametrize('n', [1, 2, 4])
def test_thread_workers_share_one_interpreter_on_gpus(n):
    # Each replica holds the lock for 0.75 of its 3 s; N thread workers
    # need N x 0.75 of it: 3 s x max(1, 0.75 N). Process workers: 3 s.
    work = launch_workload()
    hw = make_hardware()
    expected = 3.0 * max(1.0, 0.75 * n)
    assert costmodel.simulate_cgdp(work, hw, n, 1, workers='thread'
                                   ).iteration_s == pytest.approx(expected)
    assert costmodel.cgdp_closed_form(work, hw, n, 1, workers='thread') == \
        pytest.approx(expected)
    assert costmodel.simulate_cgdp(work, hw, n, 1, workers='process'
                                   ).iteration_s == pytest.approx(3.0)
    # ParallelUpdater's one thread issues every replica's kernels;
    # MultiprocessParallelUpdater's processes each their own.
    assert costmodel.simulate_typical(work, hw, n).iteration_s == \
        pytest.approx(expected)
    assert costmodel.typical_closed_form(work, hw, n) == \
        pytest.approx(expected)
    assert costmodel.simulate_nccl(work, hw, n).iteration_s == \
        pytest.approx(3.0)


def test_bad_worker_kind_names_the_choices():
    with pytest.raises(ValueError, match="'process', 'thread'"):
        costmodel.simulate_cgdp(launch_workload(), make_hardware(), 2, 1,
                                workers='fork')
    with pytest.raises(ValueError, match='workers'):
        costmodel.predict({'layers': [{'forward_flops': 1.0,
                                       'backward_flops': 1.0,
                                       'param_bytes': 4}]}, 'minsky', 2, 1,
                          workers=None)


def flops_stage(calls, layers=1, flops_per_image=1e9):
    return {'forward_flops': flops_per_image,
            'backward_flops': 2 * flops_per_image, 'param_bytes': 4,
            'param_arrays': 1, 'forward_calls': calls,
            'counted_layers': layers}


def test_a_gpu_stage_takes_at_least_its_launch_time():
    # 1 TFLOP/s: 1 GFLOP is 1 ms forward, 2 ms backward. Host: 100 us per
    # forward call and 150 us per backward call plus 10 us per kernel (two
    # per backward): 20 calls = 2.2 ms forward (launch-bound), 3.4 ms
    # backward; 5 calls = 0.55 ms and 0.85 ms (compute-bound).
    hw = make_hardware(function_forward_s=100e-6,
                       function_backward_s=150e-6, kernel_launch_s=10e-6)
    work = costmodel.build_workload({'layers': [flops_stage(20),
                                                flops_stage(5)]}, hw, 1)
    assert work.forward_s == pytest.approx([2.2e-3, 1e-3])
    assert work.backward_s == pytest.approx([3.4e-3, 2e-3])
    assert work.forward_gil_s == pytest.approx([2.2e-3, 0.55e-3])
    assert work.backward_gil_s == pytest.approx([3.4e-3, 0.85e-3])
    # Without function counts (an older profile) nothing is launch-bound.
    stage = flops_stage(20)
    del stage['forward_calls']
    work = costmodel.build_workload({'layers': [stage]}, hw, 1)
    assert work.forward_s == pytest.approx([1e-3])
    assert work.forward_gil_s is None


def test_small_layers_run_below_the_large_layer_rate():
    # A layer of conv_half_flops runs at half the rate: 1 GFLOP in 2 ms;
    # one of 9 GFLOP at 0.9 of it (10 ms); two layers of 0.5 GFLOP each
    # pay the half size twice (3 ms).
    hw = make_hardware(conv_half_flops=1e9)
    assert costmodel.inputs.gpu_flops_seconds(1e9, 1, 1, hw) == \
        pytest.approx(2e-3)
    assert costmodel.inputs.gpu_flops_seconds(9e9, 1, 1, hw) == \
        pytest.approx(10e-3)
    assert costmodel.inputs.gpu_flops_seconds(0.5e9, 2, 2, hw) == \
        pytest.approx(3e-3)
    assert costmodel.inputs.gpu_flops_seconds(0.0, 1, 1, hw) == 0.0


def test_flops_count_calls_and_layers():
    costs = layers.cached_layer_costs(ConvLinear(), 8, n_classes=10)
    # conv + relu; conv; reshape + linear with the loss and accuracy (the
    # classifier's functions go with the layer called before them).
    assert [c['forward_calls'] for c in costs] == [2, 1, 4]
    assert [c['counted_layers'] for c in costs] == [1, 1, 1]


# ------------------------------------------------ host update per optimizer

def test_adam_costs_more_on_the_host_than_momentum_sgd():
    # A preset: 2 more bytes of traffic per byte and its cost per call (a
    # CGDP chunk of 10 arrays: one fused call).
    work = workload([1.0], [1.0], [100])
    hw = make_hardware(host_thread_bw=100.0, host_memory_bw=100.0,
                       host_update_overhead_s=1e-3,
                       host_adam_overhead_s=3e-3)
    calls = costmodel.cgdp_chunk_calls(10).host_calls
    momentum = costmodel.host_job_seconds(work, hw, 1, 10, 100)
    assert momentum == pytest.approx(5.0 + calls * 1e-3)
    work.optimizer = 'adam'
    assert costmodel.host_job_seconds(work, hw, 1, 10, 100) == \
        pytest.approx(7.0 + calls * 3e-3)


def test_measured_host_update_per_optimizer():
    profile = cpu_profile()
    profile['layers'][0].update(param_bytes=400, param_arrays=2)
    profile['host']['update_rules'] = {
        'momentum_sgd': {'per_array_s': 1e-3, 'per_byte_s': 0.0},
        'adam': {'per_array_s': 4e-3, 'per_byte_s': 1e-5}}
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    adam = costmodel.build_workload(profile, hw, 1, optimizer='adam')
    # Chainer's rules, as ParallelUpdater runs them: one call per array.
    assert costs_module.host_update_seconds(adam, hw, 2, 400) == \
        pytest.approx(2 * 4e-3 + 4e-3)
    # CGDP's host job: one call over the chunk's flat slice.
    calls = costmodel.cgdp_chunk_calls(2).host_calls
    assert costmodel.host_job_seconds(adam, hw, 1, 2, 400) == \
        pytest.approx(calls * 4e-3 + 4e-3)
    sgd = costmodel.build_workload(profile, hw, 1)
    assert costmodel.host_job_seconds(sgd, hw, 1, 2, 400) == \
        pytest.approx(calls * 1e-3)
    # A profile from before the per-optimizer measurement has no Adam.
    del profile['host']['update_rules']
    with pytest.raises(ValueError, match='adam'):
        costmodel.build_workload(profile, hw, 1, optimizer='adam')
    with pytest.raises(ValueError, match='momentum_sgd, adam'):
        costmodel.build_workload(profile, hw, 1, optimizer='rmsprop')
    assert costmodel.check_optimizer(chainer.optimizers.Adam()) == 'adam'


def test_measure_host_update_and_function_overhead():
    from cgdp_chainer.costmodel import profiler
    shapes = [(64, 64), (64,)]
    for name in ('momentum_sgd', 'adam'):
        cost = profiler.measure_host_update(name, shapes, reps=1)
        assert cost['per_array_s'] > 0 and cost['per_byte_s'] >= 0
    with pytest.raises(ValueError, match='momentum_sgd, adam'):
        profiler.measure_host_update('sgd', shapes)
    with pytest.raises(ValueError, match='optimizers'):
        profiler.measure_host_updates(L.Linear(2, 2), optimizers=['sgd'])
    calls = profiler.measure_function_overhead(units=5, reps=1)
    assert calls['forward_s'] > 0 and calls['backward_s'] > 0


# ------------------------------------------------- the command-line tools

@pytest.mark.parametrize('argv, words', [
    (['--nets', 'resnet'], 'unknown network'),
    (['--nets', 'alexnet,,vgg16'], 'empty name'),
    (['--nets', 'alexnet,alexnet'], 'twice'),
    (['--bogus'], 'unrecognized'),
])
def test_costmodel_predict_refuses_bad_input(argv, words, capsys):
    from experiments import costmodel_predict
    with pytest.raises(SystemExit) as info:
        costmodel_predict.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error:') and words in err[0]


def test_costmodel_predict_refuses_an_out_that_is_a_file(tmp_path, capsys):
    from experiments import costmodel_predict
    path = tmp_path / 'file'
    path.write_text('x')
    with pytest.raises(SystemExit) as info:
        costmodel_predict.main(['--out', str(path), '--nets', 'alexnet'])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: --out')
    assert not (tmp_path / 'file' / 'predictions.csv').exists()


@pytest.mark.parametrize('argv, words', [
    (['--net', 'alexnet', '--devices', '0'], 'error:'),
    (['--net', 'alexnet', '--reps', '0'], 'positive'),
    (['--net', 'alexnet', '--statistic', 'mean'], 'invalid choice'),
    (['--net', 'alexnet', '--summary', 'no/such/summary.csv'],
     'no such summary file'),
    (['--net', 'alexnet', '--measure', '--image-size', '8'], 'alexnet'),
])
def test_validate_model_refuses_bad_input(argv, words, capsys):
    from experiments import validate_model
    with pytest.raises(SystemExit) as info:
        validate_model.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error:') and words in err[0]


def test_validate_model_refuses_an_out_in_a_file(tmp_path, capsys):
    from experiments import validate_model
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(SystemExit) as info:
        validate_model.main(['--net', 'alexnet', '--measure', '--out',
                             str(blocker / 'table.csv')])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith('error: --out')


def test_cpu_worker_processes_copy_gradients_before_their_next_backward():
    # Two stages of 1 s forward and 1 s backward with 1 GB of parameters
    # each, memcpy at 1 GB/s. A worker process copies a chunk's gradients
    # into its shared slots (1 s) before the next chunk's backward: 2 + 1
    # + 1 + 1 + 1 = 6 s; threads hand them over by reference: 4 s.
    profile = cpu_profile(cores=2)
    profile['layers'] = [dict(profile['layers'][0], param_bytes=10 ** 9,
                              param_arrays=1) for _ in range(2)]
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    for workers, expected in (('process', 6.0), ('thread', 4.0)):
        assert costmodel.simulate_cgdp(work, hw, 1, 1, workers=workers
                                       ).iteration_s == pytest.approx(
                                           expected)
        assert costmodel.cgdp_closed_form(work, hw, 1, 1,
                                          workers=workers) == \
            pytest.approx(expected)


def test_profile_counts_forward_and_backward_calls_per_layer():
    from cgdp_chainer.costmodel import profiler
    target = L.Classifier(_PlainNet())
    x = numpy.ones((2, 3, 6, 6), dtype=numpy.float32)
    t = numpy.zeros(2, dtype=numpy.int32)
    target(x, t)
    records = profiler.measure_layers(target, chainer.get_device('@numpy'),
                                      (x, t), reps=1)['layers']
    calls = [(r['forward_calls'], r['backward_calls']) for r in records]
    # conv + ReLU; l1's reshape, linear and ReLU; linear + ReLU; and the
    # last linear with the loss and accuracy (which has no backward).
    assert calls[:3] == [(2, 2), (3, 3), (2, 2)]
    assert calls[3][0] == 3 and calls[3][1] == 2
    assert all(r['forward_s'] > 0 and r['backward_s'] > 0 for r in records)
    # A measured backward count replaces the forward's in the launch time.
    hw = make_hardware(function_forward_s=1e-3, function_backward_s=1e-3,
                       kernel_launch_s=0.0)
    stage = dict(flops_stage(4, flops_per_image=0.0), backward_calls=2)
    work = costmodel.build_workload({'layers': [stage]}, hw, 1)
    assert work.forward_gil_s == pytest.approx([4e-3])
    assert work.backward_gil_s == pytest.approx([2e-3])


def test_host_jobs_run_the_fused_update_where_measured():
    # 2 arrays of 400 bytes in all in one flat slice, 3 devices: one call
    # of 1 ms + 400 x (1e-6 + 3 x 1e-7) = 1.52 ms; the Python per call
    # holds the GIL, the kernels do not. Without the fused costs, the
    # update rule's cost per call (2 ms).
    profile = cpu_profile()
    profile['layers'][0].update(param_bytes=400, param_arrays=2)
    profile['host']['ops']['update'] = {'per_array_s': 2e-3,
                                        'per_byte_s': 0.0}
    profile['host']['fused'] = {'momentum_sgd': {
        'per_array_s': 1e-3, 'per_byte_s': 1e-6, 'per_slot_byte_s': 1e-7}}
    hw = hardware.get_hardware('this-cpu', profile).replace(
        host_chunk_overhead_s=0.0)
    work = costmodel.build_workload(profile, hw, 1)
    calls = costmodel.cgdp_chunk_calls(2).host_calls
    assert costmodel.host_job_seconds(work, hw, 3, 2, 400) == \
        pytest.approx(calls * 1e-3 + 400 * (1e-6 + 3 * 1e-7))
    assert costmodel.host_job_gil_seconds(work, hw, 3, 2) == \
        pytest.approx(calls * 1e-3)
    adam = costmodel.build_workload(dict(profile, host=dict(
        profile['host'], update_rules={'adam': {'per_array_s': 2e-3,
                                                'per_byte_s': 0.0}})),
        hw, 1, optimizer='adam')
    assert adam.host_fused is None
    assert costmodel.host_job_seconds(adam, hw, 1, 2, 400) == \
        pytest.approx(calls * 2e-3)


def test_measure_fused_host_update():
    from cgdp_chainer.costmodel import profiler
    for name in ('momentum_sgd', 'adam'):
        cost = profiler.measure_fused_host_update(name, [(128, 128), (128,)],
                                                  reps=1)
        assert cost is not None
        assert cost['per_array_s'] > 0
        assert cost['per_byte_s'] >= 0 and cost['per_slot_byte_s'] >= 0


def test_predict_mode_is_the_scheme_at_one_point():
    profile = {'layers': layers.cached_layer_costs(ConvLinear(), 8,
                                                   n_classes=10),
               'batch': 1}
    result = costmodel.predict(profile, 'minsky', 2, 16)
    for mode, key in (('typical', 't_typical'), ('nccl', 't_nccl'),
                      ('cgdp', 't_cgdp')):
        seconds, size = costmodel.predict_mode(profile, 'minsky', mode, 2,
                                               16)
        assert seconds == pytest.approx(result[key])
    assert size == result['best_chunk_size']
    assert costmodel.predict_mode(profile, 'minsky', 'cgdp', 2, 16, 3)[1] \
        == 3
    with pytest.raises(ValueError, match='typical, nccl, cgdp'):
        costmodel.predict_mode(profile, 'minsky', 'chainermn', 2, 16)


def test_only_matrix_products_count_as_blas_work_for_the_gil():
    # Batch normalization's FLOPs run in NumPy loops, not in BLAS: they do
    # not shorten the time a CPU layer holds the interpreter lock.
    record = layers.cached_layer_costs(_BatchNormNet(), 8, n_classes=10)[0]
    kinds = {f['kind'] for f in record['functions']}
    assert {'matmul', 'normalization'} <= kinds
    matmul = sum(f['flops'] for f in record['functions']
                 if f['kind'] == 'matmul')
    assert costmodel.inputs.blas_flops(record) == matmul
    assert costmodel.inputs.blas_flops(record) < record['forward_flops']


class _BatchNormNet(chainer.Chain):
    """One convolution whose link also owns a batch normalization's
    parameters (one layer), then a linear layer."""

    def __init__(self):
        super(_BatchNormNet, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 4, 3, pad=1)
            self.fc = L.Linear(None, 10)
        with self.conv.init_scope():
            self.conv.gamma = chainer.Parameter(numpy.ones(4, numpy.float32))
            self.conv.beta = chainer.Parameter(numpy.zeros(4, numpy.float32))

    def forward(self, x):
        h = self.conv(x)
        h = F.batch_normalization(h, self.conv.gamma, self.conv.beta)
        return self.fc(F.relu(h))


def test_candidate_chunk_sizes_start_where_the_runtime_search_starts():
    from cgdp_chainer.costmodel import predictions
    from cgdp_chainer.runtime.chunks import chunk_choice
    assert predictions.MAX_CANDIDATE_CHUNKS == \
        chunk_choice.AUTO_SEARCH_MAX_CHUNKS
    assert costmodel.candidate_chunk_sizes(4) == [1, 2, 4]
    # ResNet-152's 311 layers: at most 64 chunks, so from 5 layers.
    assert costmodel.candidate_chunk_sizes(311) == [5, 10, 20, 40, 80, 160,
                                                    311]
