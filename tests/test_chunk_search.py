"""The runtime chunk-size search, driven by deterministic synthetic times."""
import math

import pytest

from cgdp_chainer.runtime.chunks.chunk_search import ChunkSizeSearch


def drive(search, seconds_of_size, limit=1000):
    """Runs the search to its end; returns the iterations it took."""
    iterations = 0
    while not search.done:
        search.record(seconds_of_size(search.current_size))
        iterations += 1
        assert iterations < limit, 'the search does not stop'
    return iterations


def u_shaped(best):
    """Iteration seconds falling to a minimum at ``best``, then rising."""
    return lambda size: 1.0 + abs(math.log2(size) - math.log2(best))


@pytest.mark.parametrize('n_stages,best', [(52, 8), (16, 1), (16, 4),
                                            (11, 8), (8, 8)])
def test_finds_the_best_size_of_a_u_shaped_cost(n_stages, best):
    search = ChunkSizeSearch(n_stages, trial_iterations=2, skip_first=1)
    iterations = drive(search, u_shaped(best))
    assert search.best == best
    assert search.current_size == best
    assert iterations <= search.max_trial_iterations


def test_sizes_double_from_small_to_large_and_cap_at_n_stages():
    search = ChunkSizeSearch(11, trial_iterations=1, skip_first=0)
    drive(search, lambda size: 10.0 / size)  # always faster: tries all
    assert [size for size, _ in search.history] == [1, 2, 4, 8, 11]
    assert search.best == 11


def test_stops_at_the_first_slower_size():
    search = ChunkSizeSearch(64, trial_iterations=1, skip_first=0)
    times = {1: 5.0, 2: 4.0, 4: 4.5, 8: 1.0}  # 8 would be better, unseen
    drive(search, lambda size: times[size])
    assert [size for size, _ in search.history] == [1, 2, 4]
    assert search.best == 2


def test_skipped_iterations_do_not_count_and_median_is_used():
    search = ChunkSizeSearch(4, trial_iterations=3, skip_first=1)
    # Per size: a slow first iteration (skipped), then three timed ones
    # with an outlier that the median ignores.
    script = {1: [100.0, 3.0, 9.0, 3.0], 2: [100.0, 2.0, 2.0, 50.0],
              4: [100.0, 2.5, 2.5, 2.5]}
    used = {size: 0 for size in script}

    def seconds(size):
        value = script[size][used[size]]
        used[size] += 1
        return value
    iterations = drive(search, seconds)
    assert search.history == [(1, 3.0), (2, 2.0), (4, 2.5)]
    assert search.best == 2
    assert iterations == 12
    assert search.iterations_used == 12


def test_trial_budget_bound():
    for n_stages in (1, 2, 3, 52, 100):
        search = ChunkSizeSearch(n_stages, trial_iterations=2, skip_first=1)
        iterations = drive(search, lambda size: 1.0 / size)
        assert iterations == search.max_trial_iterations
        assert search.best == n_stages


def test_record_after_done_is_ignored():
    search = ChunkSizeSearch(1, trial_iterations=1, skip_first=0)
    search.record(1.0)
    assert search.done and search.best == 1
    search.record(0.5)
    assert search.history == [(1, 1.0)]


@pytest.mark.parametrize('kwargs,word', [
    ({'n_stages': 0}, 'n_stages'),
    ({'n_stages': 4, 'trial_iterations': 0}, 'trial_iterations'),
    ({'n_stages': 4, 'skip_first': -1}, 'skip_first'),
    ({'n_stages': 4, 'start': 5}, 'start'),
])
def test_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ChunkSizeSearch(**kwargs)


def test_negative_time_is_rejected():
    search = ChunkSizeSearch(4, skip_first=0)
    with pytest.raises(ValueError, match='iteration_seconds'):
        search.record(-1.0)
