"""Multi-node CGDP: the pieces that talk to MPI.

In multi-node CGDP every rank (process) keeps master weights and the
optimizer on its host. A rank's accumulator first sums a chunk's gradients
over its local devices, then sums that chunk across the ranks with
:class:`ChunkAllreducer`, and every rank applies the same update. The
package holds what a multi-node run needs around that, one module per
concern:

* ``launch``: :func:`launched_with_mpi` / :func:`world` /
  :func:`node_ranks`: whether an MPI launcher started this process (from
  its environment, without starting MPI), the world communicator then, and
  the ranks sharing this machine; :func:`init_mpi` starts MPI with the
  thread support that the communication thread needs. The experiment
  scripts switch to their multi-rank modes by them. :func:`find_mpiexec`
  is the one place that says which mpiexec launches the project's MPI
  jobs (tests, benchmarks): ``$CGDP_MPIEXEC``, else the interpreter's.
* ``allreduce``: :class:`ChunkAllreducer` sums host arrays across ranks on
  ONE communication thread that owns every MPI call it makes, so
  accumulator threads can start chunk reductions while earlier chunks'
  backward still runs.
* ``consistency``: :func:`check_consistency`: all ranks must train the same
  model with the same optimizer (a difference raises ``ValueError`` on
  every rank); :func:`broadcast_parameters`: rank ``root``'s weights to
  every rank.
* ``faults``: :func:`abort_on_exception` / :func:`install_abort_hooks`: an
  exception on one rank prints its traceback and aborts the whole job, so
  no rank waits forever in a collective that its peer will never join.
* ``update_counts``: :class:`UpdateCountWatch`: every rank's number of
  ``update()`` calls, told to its peers, so that ranks that call it
  different numbers of times fail with :class:`UnevenUpdatesError` (both
  counts and the fix) instead of waiting forever, and a rank waiting long
  in ``update()`` names the ranks behind (``$CGDP_UPDATE_PATIENCE``).
* ``first_update``: :class:`FirstUpdateGate`: a rank that ends, or
  raises, before its first ``update()`` (after building its multi-node
  optimizer or updater) is named to its peers, whose first ``update()``
  raises :class:`PeerEndedError` instead of waiting for it forever.
* ``data``: :func:`shard_dataset`: each rank's part of the dataset; the
  global batch is the union of the ranks' batches.
* ``chainermn_baseline``: :func:`make_chainermn_updater`, the ChainerMN
  baseline.
* ``shm``: MPICH's shared-memory segments in ``/dev/shm``, which the abort
  path unlinks, since no rank finalizes after ``MPI_Abort``.
* ``chainermn_optimizer``: :func:`host_optimizer_and_comm`, how
  ``CGDPUpdater`` takes a ChainerMN multi-node optimizer (it trains across
  that optimizer's communicator; :func:`broadcasting_first_update`: its
  first ``update()`` broadcasts, as ChainerMN's) and refuses other
  optimizers whose ``update()`` it would bypass.
* ``updater_ranks``: :class:`UpdaterRanks`, what ``CGDPUpdater`` does
  across the ranks, from its construction (the communicator, the armed
  first update) through its first update (the checks, rank 0's weights,
  the all-reduce, the count watch) to its end.
* ``host_staged``: :func:`create_host_staged_communicator`, ChainerMN's
  naive communicator with its GPU arrays staged through host memory, for
  ChainerMN's reference runs on GPUs where MPI is not CUDA-aware (CGDP's
  GPU path reduces host arrays and never needs it). Not imported here:
  it imports ChainerMN, which starts MPI; import
  ``cgdp_chainer.mpi.host_staged`` where it is used.

``mpi4py.MPI`` is imported lazily, inside the functions, so that importing
this package does not start MPI in single-process runs.
"""
from cgdp_chainer.mpi.allreduce import AllreduceHandle  # NOQA
from cgdp_chainer.mpi.allreduce import ChunkAllreducer  # NOQA
from cgdp_chainer.mpi.allreduce import SUPPORTED_DTYPES  # NOQA
from cgdp_chainer.mpi.chainermn_baseline import make_chainermn_updater  # NOQA
from cgdp_chainer.mpi.chainermn_optimizer import (  # NOQA
    host_optimizer_and_comm)
from cgdp_chainer.mpi.chainermn_optimizer import (  # NOQA
    broadcasting_first_update)
from cgdp_chainer.mpi.chainermn_optimizer import refuse_bypassed_update  # NOQA
from cgdp_chainer.mpi.chainermn_optimizer import SeparateModelsWarning  # NOQA
from cgdp_chainer.mpi.consistency import broadcast_parameters  # NOQA
from cgdp_chainer.mpi.consistency import check_consistency  # NOQA
from cgdp_chainer.mpi.consistency import describe_setup  # NOQA
from cgdp_chainer.mpi.consistency import first_difference  # NOQA
from cgdp_chainer.mpi.data import shard_dataset  # NOQA
from cgdp_chainer.mpi.data import shard_range  # NOQA
from cgdp_chainer.mpi.faults import abort_job  # NOQA
from cgdp_chainer.mpi.faults import abort_on_exception  # NOQA
from cgdp_chainer.mpi.faults import AbortOnException  # NOQA
from cgdp_chainer.mpi.faults import install_abort_hooks  # NOQA
from cgdp_chainer.mpi import first_update  # NOQA
from cgdp_chainer.mpi.first_update import FirstUpdateGate  # NOQA
from cgdp_chainer.mpi.first_update import PeerEndedError  # NOQA
from cgdp_chainer.mpi.launch import as_mpi_comm  # NOQA
from cgdp_chainer.mpi.launch import check_thread_support  # NOQA
from cgdp_chainer.mpi.launch import find_mpiexec  # NOQA
from cgdp_chainer.mpi.launch import init_mpi  # NOQA
from cgdp_chainer.mpi.launch import LAUNCH_VARIABLES  # NOQA
from cgdp_chainer.mpi.launch import launch_rank_and_size  # NOQA
from cgdp_chainer.mpi.launch import launched_with_mpi  # NOQA
from cgdp_chainer.mpi.launch import launcher_size  # NOQA
from cgdp_chainer.mpi.launch import MPIEXEC_VARIABLE  # NOQA
from cgdp_chainer.mpi.launch import no_mpiexec_words  # NOQA
from cgdp_chainer.mpi.launch import node_ranks  # NOQA
from cgdp_chainer.mpi.launch import thread_level_name  # NOQA
from cgdp_chainer.mpi.launch import world  # NOQA
from cgdp_chainer.mpi.update_counts import PATIENCE_VARIABLE  # NOQA
from cgdp_chainer.mpi.update_counts import UnevenUpdatesError  # NOQA
from cgdp_chainer.mpi.update_counts import UpdateCountWatch  # NOQA
from cgdp_chainer.mpi.updater_ranks import UpdaterRanks  # NOQA
