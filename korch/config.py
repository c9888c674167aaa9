"""korch's version and its tuning constants, each with what it trades. Constants that change what a
kernel computes or how it is checked stay beside the code a backend's version hashes (the tolerances
in korch.measure.tolerance, MATMUL_RESIZE_FLOPS in korch.backends.onnx_patterns), so that changing
them re-profiles; the numbers behind the choices: BENCHMARKS.md, "Measurements behind design constants"."""

VERSION = "0.1.0"  # korch's version (pyproject.toml says the same); plans and the database record it

# ir: constant folding at build time
FOLD_LIMIT = 1024  # fold results up to this many elements (or an input's size): fewer primitives, more bytes
BROADCAST_FOLD_LIMIT = 64  # fold a broadcast only this small: materialising one costs memory only

# front ends
MAX_UNROLL = 4096  # iterations of a Loop or Scan unrolled at most: models accepted against graph size
CHUNKED_FROM = 16  # sequence steps from which linear attention is lowered in chunks (not step by step)

# search: what a candidate's key holds
SMALL_CONSTANT = 8  # constants up to this size are baked into kernels: fewer inputs, fewer shared keys
# integer constants (gather indices) up to this size are baked in too: they fix which elements a kernel
# reads and let a backend recognise what they do (a nearest upsampling is a Resize), at fewer shared keys
INDEX_CONSTANT = 4096

# rewrites: when a rewrite is kept
GAIN = 0.8  # a FLOP-saving rewrite must leave under this fraction of the FLOPs: skips marginal folds
FASTER = 0.8  # a measured rewrite must take under this fraction of the time: noise never decides
NARROW = 4  # widen convolutions of at most this many output channels: more folded work for vector width
BLOCK = 2  # output pixels folded per axis when widening: more channels against a larger weight

# running: freed memory at the top of glibc's heap kept in the process, up to this much, instead of given
# back after every call and faulted in again by the next (korch.measure.heap): memory held for speed
HEAP_KEEP_BYTES = 256 << 20

# measuring
WAKE_CALLS = 3  # calls after a pause before timing: the first calls after a sleep run slow
RETIMES = 2  # a timing taken while others used the CPU is retaken this many times: accuracy for time
RETIME_PAUSE_S = 0.1  # pause before the first retake (twice that before the second): let a burst pass
# /proc/stat counts in ticks: one tick of noise either way is common, so a window is disturbed when
# others took at least MIN_TICKS ticks and MIN_CORES of a core on average (fewer false alarms, later alarms)
MIN_TICKS = 2
MIN_CORES = 0.2
# before a timing, wait at most this long for korch's own threads to stop running (korch.measure.busy.settle)
SETTLE_MAX_S = 0.3

# profiling
# the timings that decide most (the source model alone, each plan in place) are spread over SPREAD times
# min_time, so that a neighbour taking a core for seconds cannot double all of them: trust for time
SPREAD = 125
AUTOTUNE_LINEAR = 2  # linear primitives at most in an inductor-autotune candidate: each one autotuned
# Inductor kernels of at least this many primitives call their kernels from C++ on CPU (cpp_wrapper):
# a shorter compile of a large kernel, a longer one of a small frozen kernel (compiled again every time)
CPP_WRAPPER_FROM = 32
SOURCE_DISCRETE_MISMATCH = 0.01  # integer outputs of the source model allowed to differ from the graph's
STARTUP_S = 120.0  # a worker not ready after this long is stuck: a slow import against a hung one
STARTUP_FAILURES = 3  # workers lost while starting, none ever ready, before profiling gives up
LOCK_WAIT_S = 5.0  # wait for another program's lock on the database, then stop with one line
ENVIRONMENTAL_CAP = 3  # machine failures (worker died, timeout, out of memory) retried before kept as final
# a cache line's round trip between the process's CPUs over this factor of the least in a run (taken as
# at most NEAR_NS, so that a run far throughout is seen as far): CPUs that share no cache
# (korch.measure.placement; BENCHMARKS.md, design constants)
FAR = 2.0
NEAR_NS = 100.0

# orchestration
MAX_CUTS = 500  # cuts against cyclic kernel orders before selection gives up: a refusal against a long solve
TOP = 3  # alternatives the solver turned down, kept per kernel for explain
SPLIT_LIMIT = 16  # kernels with more primitives are not split exactly (2^n subsets) for explain
SAFETY = 1.5  # a lower bound's rates may be beaten by this factor: looser bounds, measured more, but honest
LAUNCH_SAFETY = 0.5  # the least call seen per backend times this is the floor of its calls
SIZE_WINDOW = 4  # a kernel's byte rate is the fastest among kernels at least 1/SIZE_WINDOW its size
CLASS_MARGIN = 2  # a linear primitive's class's fastest rate may be beaten by this factor
CLASS_MARGIN_ONE = 1.5  # ... by this factor where the kernel holds that one linear primitive only
ROUND_MOST = 64  # (kernel, backend) pairs a search round measures at most, the heaviest, before solving again

# pipeline: the time budget and the choice between measured plans
PRIORITY_SHARE = 0.5  # of --time-budget, at most, for the kernels that make plans alone (then search)
WHOLE_GRAPH_REACH = 10.0  # whole-graph plans isolated within this factor of the best are measured in place
IN_PLACE_FLOOR = 0.5  # a negative in-place correction takes at most this share of a kernel's isolated time
OMP_SPINCOUNT = 3000  # an idle GNU OpenMP worker's spins before it sleeps (korch.measure.openmp; GNU's: 300k)
# plans measured within this factor of the fastest (by minima) are timed again side by side: plans are
# measured minutes apart, and a slow episode of a shared machine, seconds long, slows some plans more
RUNOFF = 2.0
RUNOFF_ROUNDS = 8  # rounds of that runoff: a surer choice against optimize's time
# ... counted only where the plans ran, on their median, within this factor of their fastest: each slow
# round is run again, up to RUNOFF_ROUNDS more (korch.measure.timing.calm_rounds)
RUNOFF_CALM = 1.25
RUNOFF_SIGNIFICANCE = 0.05  # a plan replaces the source model when a sign test over the rounds says so

# plans
LOAD_TRIES = 5  # loads of a plan that other processes keep replacing, before giving up
