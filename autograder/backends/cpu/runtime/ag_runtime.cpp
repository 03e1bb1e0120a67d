// The CPU backend's runtime: it runs a CUDA kernel's blocks one after another on one OS thread, every CUDA
// thread a fiber, and checks every memory access the instrumented build reports through GCC's
// ThreadSanitizer hooks (defined at the end of this file; no ThreadSanitizer library is linked).
//
// Python drives it through the extern "C" functions marked API. Findings and metrics are kept here until
// Python reads them. Their messages hold placeholders that only Python can fill in: {pc:HEX} (a code
// address in the instrumented kernel library, shown as the notebook line), {line:N} (a kernel-source line),
// {arg:K} (the name of kernel parameter K) and {dyn} (the name of the extern __shared__ array).
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ag_fiber.h"

struct ag_uint3 {
    unsigned int x, y, z;
};

// The runtime is built with hidden visibility, so that two runtimes in one process (Boost and ucontext
// fibers, say) never share a symbol; only the extern "C" names between these pragmas are exported.
#pragma GCC visibility push(default)
// The built-ins the prelude declares const: only the scheduler writes them.
extern "C" {
ag_uint3 threadIdx, blockIdx, blockDim, gridDim;
unsigned char *__ag_dynamic_shared;
}
#pragma GCC visibility pop

namespace ag {

constexpr int kMaxThreads = 1024;
constexpr std::size_t kStackBytes = 64 * 1024;
constexpr std::size_t kDynamicSharedMax = 228 * 1024;  // an sm_90's opt-in maximum
// The static __shared__ arrays of one kernel library (a GPU allows 48 KiB); address space only.
constexpr std::size_t kStaticSharedMax = 4 * 1024 * 1024;
constexpr std::size_t kArenaBytes = kDynamicSharedMax + kStaticSharedMax;
constexpr std::size_t kRedZoneBytes = 64 * 1024;  // around each global buffer: out-of-bounds but addressable
constexpr std::size_t kMaxFindingsPerLaunch = 256;

enum Schedule { RUN_UNTIL_BLOCKED, LOCKSTEP, REVERSED, RANDOM };
// Finding codes: backend.py's RUNTIME_KINDS names them in this order.
enum Kind { RACE_SYNCTHREADS, RACE_SYNCWARP, RACE_INTERBLOCK, OUT_OF_BOUNDS, UNINITIALISED_READ, DEADLOCK,
            INACTIVE_LANE, BARRIER_DIVERGENCE, KEPT_STATE };
enum Wait : std::uint8_t { RUNNABLE, AT_BARRIER, AT_WARP, EXITED };
// Warp collective codes, as in ag_prelude.h.
enum { SYNCWARP, SHFL, SHFL_UP, SHFL_DOWN, SHFL_XOR, BALLOT, ANY, ALL, REDUCE_ADD, REDUCE_MIN, REDUCE_MAX,
       MATCH_ANY, MATCH_ALL };
enum { A_ADD, A_SUB, A_EXCH, A_MIN, A_MAX, A_CAS, A_AND, A_OR, A_XOR, A_INC, A_DEC };
enum { T_INT, T_UNSIGNED, T_FLOAT, T_DOUBLE };

}  // namespace ag

extern "C" {
// API records, mirrored by ctypes structures in backend.py.
struct AgLaunch {
    void (*checked)(void **);  // the instrumented build's entry; null to run unchecked
    void (*fast)(void **);     // the plain build's entry; null when there is none
    void **args;
    int nargs;
    unsigned int grid[2];
    unsigned int block[2];
    unsigned long long shared_bytes;
    int kernel_id;  // unique in the process: every backend in it shares this runtime
    int schedule;   // ag::Schedule
    unsigned long long seed;          // the schedule's, for a random one
    unsigned long long measure_seed;  // which blocks feed the metrics (measured_blocks)
};
struct AgFinding {
    int kind;
    int line;         // kernel-source line, or 0
    unsigned int pc;  // offset in the instrumented library, or 0
    int kernel_id;
    int writes;       // OUT_OF_BOUNDS: the access wrote (a store or an atomic); 0: it read, or another kind
    char thread[64];
    char message[512];
};
struct AgMetric {
    int kernel_id;
    unsigned int pc;
    unsigned long long requests;
    unsigned long long transactions;
};
}

namespace ag {

// One access as the race checker remembers it.
struct Access {
    std::uint32_t thread;  // launch-wide thread number + 1 (0: none); top bit: atomic
    std::uint32_t epoch;   // the block's barrier count at the access
    std::uint32_t clock;   // the thread's own warp clock at the access
    std::uint32_t pc;
};
// The shadow of one 4-byte word. `gen` says which block (shared) or launch (global) it belongs to, so no
// shadow ever needs clearing. Plain and atomic accesses are kept apart: an atomic never hides a plain access
// that a later atomic of another block races with.
struct Cell {
    std::uint32_t gen;
    Access write;    // the last plain write
    Access read[2];  // plain reads since that write
    Access atomic;   // the last atomic read-modify-write
};

struct Buffer {
    char *zone_lo;  // start of the leading red zone
    std::size_t zone_span;
    char *data;
    std::size_t count, guard;  // float32 values the kernel may use, then the guard tail
    std::size_t map_bytes;
    Cell *cells = nullptr;  // shadow of count + guard words, mapped on first checked use
    int arg = -1;           // kernel parameter index in the current launch
    std::string name;       // a variable's name (ag_watch_variables); empty for the grader's buffers
    std::string what;       // how a message names the variable
};

struct StaticShared {
    std::size_t offset, size;
    const char *name;  // the variable's name, a string literal in the kernel library
};
// The static __shared__ arrays of one kernel library, laid out from the start of the arena's static part.
// Every library has its own layout over the same addresses: one kernel runs at a time, and nothing that one
// kernel allocates or leaves in shared memory reaches another.
struct StaticLayout {
    std::size_t used = 0;
    std::vector<StaticShared> arrays;  // in increasing offset order
};

struct Thread {
    Wait wait;
    int line;  // where it waits
    long long site;  // which __syncthreads() it waits at: its line and its place among the source's barriers
                     // (two on one line are two barriers)
    int op;
    ag_uint3 idx;
    unsigned int tid, lane, warp;
    std::uint32_t clock[32];  // a vector clock over the lanes of its warp
    unsigned int mask;
    unsigned long long value, result;
    int arg, width;
    std::uint64_t path;  // hash of the basic blocks run since the last barrier (divergence metric)
    bool ran;
    std::uint64_t last_global_write, last_fence;  // sequence numbers, for __threadfence()
    unsigned long long shared_accesses;  // in a measured block: its accesses to shared memory, atomics too
};

struct MetricKey {
    int kernel_id;
    unsigned int pc;
    bool operator<(const MetricKey &o) const { return kernel_id != o.kernel_id ? kernel_id < o.kernel_id : pc < o.pc; }
};
struct SharedRecord {
    unsigned int pc, seq, warp, word;
    unsigned int phase;  // which part of the warp the hardware serves together (the lanes' access width decides)
};
struct GlobalRecord {
    unsigned int pc, seq, warp;
    std::uintptr_t word;  // the address / 4
};
// Counts over the measured blocks of one kernel, for autograder.technique (see ag_counts).
struct Counts {
    unsigned long long blocks, barriers, diverged, shuffles, lone_shared_requests, global_requests, global_sectors,
        global_words, busiest_thread_shared, shared_atomics;
};

struct State {
    // configuration
    Schedule schedule = RUN_UNTIL_BLOCKED;
    std::mt19937_64 rng{0};
    int metrics_blocks = 4;
    long long full_check_threads = 1 << 20;
    int sample_blocks = 64;
    // The only blocks the next launches run, all checked, and measured where `only_measured` (ag_run_only); empty:
    // every block.
    std::vector<long long> only;
    bool only_measured = true;
    // memory
    unsigned char *arena = nullptr;
    Cell *arena_cells = nullptr;
    std::map<std::uintptr_t, StaticLayout> layouts;  // by the kernel library's load address
    const StaticLayout *launch_layouts[2] = {};      // this launch's instrumented and plain builds'
    std::unordered_map<void *, Buffer *> buffers;
    Buffer *active[8];
    int nactive = 0;
    // The __device__ variables of each kernel library (by its load address), in address order, and this
    // launch's: global memory the kernel holds itself, checked as the grader's buffers are.
    std::map<std::uintptr_t, std::vector<Buffer *>> variables;
    const std::vector<Buffer *> *launch_variables = nullptr;
    char *stacks = nullptr;
    // the launch
    AgLaunch launch{};
    unsigned int nthreads = 0;
    std::uint32_t launch_gen = 0, block_gen = 0;
    std::uintptr_t pc_base = 0;
    bool checking = false;   // this block runs the instrumented build
    bool measuring = false;  // this block feeds the metrics
    std::uint32_t block_linear = 0;
    std::uint64_t sequence_number = 0;
    // Threads whose last global write was followed by a __threadfence(): other blocks may read what they
    // wrote (the last-block pattern: write, fence, atomic ticket). One bit per thread of the launch.
    std::vector<std::uint64_t> published;
    bool block_acquired = false;  // this block has done an atomic on global memory
    // the block
    Thread threads[kMaxThreads];
    Fiber fibers[kMaxThreads];
    int current = 0;
    std::uint32_t epoch = 0;
    unsigned int exited_at_release = 0;  // threads of the block that had exited when its last barrier released
    bool block_diverged = false;         // a barrier of this block was reached by only part of it
    std::vector<int> order;
    // results
    std::vector<AgFinding> findings;
    std::unordered_set<std::uint64_t> seen;
    bool stray_write_told = false;  // this launch reported a write out of bounds
    std::map<MetricKey, std::pair<unsigned long long, unsigned long long>> metrics;
    std::map<int, std::pair<unsigned long long, unsigned long long>> divergence;
    std::vector<SharedRecord> records;
    std::vector<GlobalRecord> global_records;
    std::map<int, Counts> counts;
    std::unordered_map<std::uint64_t, unsigned int> sequence;
    std::string error;
    std::string unchecked;  // why a checked access of this launch could not be checked (its shadow not mapped)
};
State g;

Thread &me() { return g.threads[g.current]; }

std::uint32_t pc_offset(void *return_address) {
    return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(return_address) - g.pc_base - 1);
}

std::string describe_thread(const Thread &t) {
    char text[64];
    std::snprintf(text, sizeof text, "block (%u,%u,0) thread (%u,%u,0)", blockIdx.x, blockIdx.y, t.idx.x, t.idx.y);
    return text;
}

// `writes`: an out-of-bounds access that wrote. The first of a launch is told even past the limit of findings,
// so that reads out of bounds cannot hide one (a write out of bounds keeps a GPU worker from a later student).
void report(int kind, int line, std::uint32_t pc, const std::string &thread, const std::string &message,
            bool writes = false) {
    // One report per kind and place; Python merges places that share a source line.
    std::uint64_t key = (static_cast<std::uint64_t>(kind) << 40) | (static_cast<std::uint64_t>(line) << 32) | pc;
    if (!g.seen.insert(key).second) return;
    if (g.findings.size() >= kMaxFindingsPerLaunch && !(writes && !g.stray_write_told)) return;
    g.stray_write_told = g.stray_write_told || writes;
    AgFinding f{};
    f.kind = kind;
    f.line = line;
    f.pc = pc;
    f.kernel_id = g.launch.kernel_id;
    f.writes = writes;
    std::snprintf(f.thread, sizeof f.thread, "%s", thread.c_str());
    std::snprintf(f.message, sizeof f.message, "%s", message.c_str());
    g.findings.push_back(f);
}

// ---------------------------------------------------------------------------------------------------------
// Memory: global buffers with red zones, and the shared arena (dynamic part first, then static arrays).

void *map_memory(std::size_t bytes) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}

bool ensure_arena() {
    if (g.arena) return true;
    g.arena = static_cast<unsigned char *>(map_memory(kArenaBytes));
    g.arena_cells = static_cast<Cell *>(map_memory(kArenaBytes / 4 * sizeof(Cell)));
    // Each fiber's stack sits above a guard page, so an overflow faults instead of corrupting a neighbour.
    const std::size_t slot = kStackBytes + 4096;
    g.stacks = static_cast<char *>(map_memory(slot * kMaxThreads));
    if (!g.arena || !g.arena_cells || !g.stacks) return false;
    for (int i = 0; i < kMaxThreads; ++i) mprotect(g.stacks + i * slot, 4096, PROT_NONE);
    __ag_dynamic_shared = g.arena;
    return true;
}

// Mapped as the runtime loads, before any kernel library (which depends on it) runs its initialisers: a
// namespace-scope `extern __shared__` array takes the arena's address then, and it never changes.
__attribute__((constructor)) void map_arena_at_load() { ensure_arena(); }

// Shared memory starts every block holding NaN (0xff bytes), whatever ran before: a read of a word no thread
// wrote spoils a sum, as stale data does on a GPU, and the same way whichever kernel ran earlier.
constexpr int kSharedPoison = 0xff;

std::uintptr_t library_base(const void *code) {
    Dl_info info{};
    return code && dladdr(code, &info) ? reinterpret_cast<std::uintptr_t>(info.dli_fbase) : 0;
}

// The static array of the instrumented build at or just before arena offset `offset`.
const StaticShared *static_at(std::size_t offset) {
    if (!g.launch_layouts[0]) return nullptr;
    const std::vector<StaticShared> &arrays = g.launch_layouts[0]->arrays;
    auto after = std::upper_bound(arrays.begin(), arrays.end(), offset,
                                  [](std::size_t o, const StaticShared &s) { return o < s.offset; });
    return after == arrays.begin() ? nullptr : &*(after - 1);
}

void poison_shared_memory() {
    std::memset(g.arena, kSharedPoison, g.launch.shared_bytes);
    std::size_t used = 0;
    for (const StaticLayout *layout : g.launch_layouts)
        if (layout) used = std::max(used, layout->used);
    std::memset(g.arena + kDynamicSharedMax, kSharedPoison, used);
}

// Where a word is, for messages: `name[index]` (index in 4-byte words). Only built when something is reported.
struct Place {
    int arg;            // kernel parameter of a global buffer, or -1 for shared memory
    std::size_t where;  // the word index in the buffer, or the byte offset in the shared arena
    const char *variable = nullptr;  // or the __device__ variable it is in
};

std::string place_text(const Place &place) {
    char text[160];
    if (place.variable) {
        std::snprintf(text, sizeof text, "%s[%zu]", place.variable, place.where);
    } else if (place.arg >= 0) {
        std::snprintf(text, sizeof text, "{arg:%d}[%zu]", place.arg, place.where);
    } else if (place.where < kDynamicSharedMax) {
        std::snprintf(text, sizeof text, "{dyn}[%zu]", place.where / 4);
    } else if (const StaticShared *array = static_at(place.where)) {
        std::snprintf(text, sizeof text, "%s[%zu]", array->name, (place.where - array->offset) / 4);
    } else {
        std::snprintf(text, sizeof text, "shared memory");
    }
    return text;
}

// ---------------------------------------------------------------------------------------------------------
// The race checker.

std::uint32_t my_thread_number() { return g.block_linear * g.nthreads + me().tid; }

const char *verb(bool write) { return write ? "writes" : "reads"; }
const char *verb(const Access &a, bool write) { return a.thread >> 31 ? "atomically updates" : verb(write); }

void check_pair(const Access &prior, bool prior_write, const Access &now, bool now_write, const Place &place) {
    if (prior.thread == 0) return;
    const std::uint32_t other = (prior.thread & 0x7fffffffu) - 1;
    const std::uint32_t mine = (now.thread & 0x7fffffffu) - 1;
    if (other == mine) return;
    if ((prior.thread & now.thread) >> 31) return;  // both atomic
    const std::uint32_t other_block = other / g.nthreads, other_tid = other % g.nthreads;
    const Thread &t = me();
    int kind;
    const char *advice;
    if (other_block != g.block_linear) {
        // Release and acquire, as the last-block pattern needs: the writer fenced after its write, and this
        // block has since done an atomic on global memory (drawn its ticket).
        const bool published = other / 64 < g.published.size() && (g.published[other / 64] >> (other % 64) & 1);
        if (prior_write && published && g.block_acquired) return;
        kind = RACE_INTERBLOCK;
        advice = "blocks are not ordered within a launch: give each block its own output, or use atomics";
    } else if (prior.epoch != g.epoch) {
        return;  // a __syncthreads() lies between them
    } else if (other_tid / 32 == t.warp) {
        if (t.clock[other_tid % 32] > prior.clock) return;  // a __syncwarp() or shuffle orders them
        kind = RACE_SYNCWARP;
        advice = "lanes of a warp are not in lockstep since Volta: put __syncwarp() between the steps";
    } else {
        kind = RACE_SYNCTHREADS;
        advice = "put __syncthreads() between the write and the other thread's access";
    }
    char other_text[96];
    const unsigned int bx = g.launch.block[0], gx = g.launch.grid[0];
    if (other_block == g.block_linear)
        std::snprintf(other_text, sizeof other_text, "thread (%u,%u,0) of the same block", other_tid % bx,
                      other_tid / bx);
    else
        std::snprintf(other_text, sizeof other_text, "thread (%u,%u,0) of another block, (%u,%u,0),",
                      other_tid % bx, other_tid / bx, other_block % gx, other_block / gx);
    char this_text[64] = "";
    if (other_block != g.block_linear)  // name both blocks, so neither reads as the other's
        std::snprintf(this_text, sizeof this_text, " of block (%u,%u,0)", g.block_linear % gx, g.block_linear / gx);
    char message[600];
    std::snprintf(message, sizeof message,
                  "data race on %s: thread (%u,%u,0)%s %s it at {pc:%x} and %s %s it at {pc:%x} "
                  "with nothing ordering the two; %s",
                  place_text(place).c_str(), t.idx.x, t.idx.y, this_text, verb(now, now_write), now.pc, other_text,
                  verb(prior, prior_write), prior.pc, advice);
    report(kind, 0, now.pc, describe_thread(t), message);
}

bool obsolete(const Access &a) {
    return a.thread == 0 || (((a.thread & 0x7fffffffu) - 1) / g.nthreads == g.block_linear && a.epoch != g.epoch);
}

void check_cell(Cell &c, std::uint32_t gen, bool write, bool atomic, std::uint32_t pc, bool shared,
                const Place &place) {
    if (c.gen != gen) c = Cell{gen, {}, {{}, {}}, {}};
    Thread &t = me();
    const Access now{(my_thread_number() + 1) | (atomic ? 0x80000000u : 0u), g.epoch, t.clock[t.lane], pc};
    if (shared && (!write || atomic) && c.write.thread == 0 && c.atomic.thread == 0) {
        char message[400];
        std::snprintf(message, sizeof message,
                      "thread (%u,%u,0) reads %s at {pc:%x}, which no thread of this block has written: "
                      "shared memory starts each block holding garbage",
                      t.idx.x, t.idx.y, place_text(place).c_str(), pc);
        report(UNINITIALISED_READ, 0, pc, describe_thread(t), message);
    }
    check_pair(c.write, true, now, write, place);
    check_pair(c.atomic, true, now, write, place);
    if (write) {
        check_pair(c.read[0], false, now, true, place);
        check_pair(c.read[1], false, now, true, place);
    }
    if (atomic) {
        c.atomic = now;
        return;
    }
    if (write) {
        c.write = now;
        c.read[0] = c.read[1] = Access{};
        return;
    }
    // Keep up to two readers that a later write could race with. A slot is free when it is empty, holds this
    // thread, or holds a read of this block that a barrier has since ordered.
    for (Access &slot : c.read) {
        if (slot.thread == now.thread || obsolete(slot)) {
            slot = now;
            return;
        }
    }
    c.read[1] = now;
}

// A shared-memory access, for the bank-conflict count: every word it touches, as one lane's part of a request.
// A GPU serves a request of 8-byte accesses (double, float2) in two phases of half a warp, of 16-byte ones in
// four of a quarter: 128 bytes a phase, which a phase reads at once from 32 banks.
void record_request(std::uint32_t pc, std::size_t offset, std::size_t size) {
    const Thread &t = me();
    const std::uint64_t key = (static_cast<std::uint64_t>(pc) << 16) | t.tid;
    const unsigned int seq = g.sequence[key]++;
    const unsigned int phases = size >= 16 ? 4 : size >= 8 ? 2 : 1;
    const unsigned int phase = t.lane / (32 / phases);
    for (std::size_t word = offset / 4; word <= (offset + std::max<std::size_t>(size, 1) - 1) / 4; ++word)
        g.records.push_back({pc, seq, t.warp, static_cast<unsigned int>(word), phase});
}

// A load from global memory, for the coalescing count: every word it reads, as one lane's part of a request.
void record_global_load(std::uint32_t pc, const char *address, std::size_t size) {
    const Thread &t = me();
    const std::uint64_t key = (static_cast<std::uint64_t>(pc) << 16) | t.tid;
    const unsigned int seq = g.sequence[key]++;
    const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(address) / 4;
    for (std::uintptr_t word = first; word <= (reinterpret_cast<std::uintptr_t>(address) + size - 1) / 4; ++word)
        g.global_records.push_back({pc, seq, t.warp, word});
}

void yield_for_schedule() {
    if (g.schedule == LOCKSTEP || (g.schedule == RANDOM && (g.rng() & 3) == 0)) Fiber::suspend();
}

void shared_access(std::size_t offset, std::size_t size, bool write, bool atomic, std::uint32_t pc) {
    yield_for_schedule();
    bool inside;
    if (offset < kDynamicSharedMax) {
        inside = offset + size <= g.launch.shared_bytes;
    } else {
        const StaticShared *array = static_at(offset);
        inside = array && offset + size <= array->offset + array->size;
    }
    Thread &t = me();
    if (!inside) {
        char message[400];
        if (offset < kDynamicSharedMax)
            std::snprintf(message, sizeof message,
                          "thread (%u,%u,0) %s %s at {pc:%x}, past the %llu bytes of dynamic shared memory "
                          "of this launch",
                          t.idx.x, t.idx.y, verb(write), place_text({-1, offset}).c_str(), pc, g.launch.shared_bytes);
        else
            std::snprintf(message, sizeof message,
                          "thread (%u,%u,0) %s %s at {pc:%x}, past the end of the __shared__ array",
                          t.idx.x, t.idx.y, verb(write), place_text({-1, offset}).c_str(), pc);
        report(OUT_OF_BOUNDS, 0, pc, describe_thread(t), message, write);
        return;
    }
    if (g.measuring) {
        t.shared_accesses++;
        if (atomic) g.counts[g.launch.kernel_id].shared_atomics++;
        else record_request(pc, offset, size);
    }
    for (std::size_t word = offset / 4; word <= (offset + size - 1) / 4; ++word)
        check_cell(g.arena_cells[word], g.block_gen, write, atomic, pc, true, Place{-1, word * 4});
}

Cell *buffer_cells(Buffer &b) {
    if (!b.cells) b.cells = static_cast<Cell *>(map_memory((b.count + b.guard) * sizeof(Cell)));
    return b.cells;
}

void global_access(Buffer &b, char *address, std::size_t size, bool write, bool atomic, std::uint32_t pc) {
    const long long first = (address - b.data) >= 0 ? (address - b.data) / 4 : -((b.data - address + 3) / 4);
    const long long last = (address + size - 1 - b.data) / 4;
    const char *variable = b.name.empty() ? nullptr : b.name.c_str();
    if (first < 0 || last >= static_cast<long long>(b.count)) {
        const Thread &t = me();
        const std::string name = variable ? b.what : "{arg:" + std::to_string(b.arg) + "}";
        char message[600];
        std::snprintf(message, sizeof message,
                      "thread (%u,%u,0) %s %s[%lld] at {pc:%x}, outside the %zu %s of %s: check the index "
                      "against %s before the access",
                      t.idx.x, t.idx.y, verb(write), variable ? variable : name.c_str(), first, pc, b.count,
                      variable ? "4-byte words" : "values", name.c_str(), variable ? "the variable's size" : "n");
        report(OUT_OF_BOUNDS, 0, pc, describe_thread(t), message, write);
        return;
    }
    Cell *cells = buffer_cells(b);
    if (!cells) {  // the machine refused the shadow's address space: the launch must not pass as checked
        if (g.unchecked.empty())
            g.unchecked = "could not map the shadow memory of a buffer of " + std::to_string(b.count) +
                          " values, so its races, bounds and stale reads were not checked: the machine refused " +
                          std::to_string((b.count + b.guard) * sizeof(Cell) >> 20) + " MiB of address space";
        return;
    }
    if (write && !atomic) me().last_global_write = ++g.sequence_number;  // what a fence must publish
    if (g.measuring && !write && !atomic) record_global_load(pc, address, size);
    for (long long word = first; word <= last; ++word) {
        const Cell &c = cells[word];
        // A __device__ variable read before this launch wrote it, where an earlier launch did: what the kernel
        // reads there is state it kept between launches (the timed calls run many in a row; a check, few).
        if (variable && (!write || atomic) && c.gen != g.launch_gen && (c.write.thread || c.atomic.thread)) {
            const Thread &t = me();
            char message[400];
            std::snprintf(message, sizeof message,
                          "thread (%u,%u,0) reads %s[%lld] at {pc:%x}, which an earlier launch wrote: a kernel keeps "
                          "nothing between launches, each pass a function of its input alone",
                          t.idx.x, t.idx.y, variable, word, pc);
            report(KEPT_STATE, 0, pc, describe_thread(t), message);
        }
        check_cell(cells[word], g.launch_gen, write, atomic, pc, false,
                   Place{b.arg, static_cast<std::size_t>(word), variable});
    }
}

// The __device__ variable of this launch's library whose span (the variable, then its padding up to the next
// symbol of its section) holds address `a`, if any.
Buffer *variable_at(std::uintptr_t a) {
    if (!g.launch_variables) return nullptr;
    const std::vector<Buffer *> &variables = *g.launch_variables;
    auto after = std::upper_bound(variables.begin(), variables.end(), a, [](std::uintptr_t x, const Buffer *b) {
        return x < reinterpret_cast<std::uintptr_t>(b->data);
    });
    if (after == variables.begin()) return nullptr;
    Buffer *b = *(after - 1);
    return a - reinterpret_cast<std::uintptr_t>(b->zone_lo) < b->zone_span ? b : nullptr;
}

void on_access(void *address, std::size_t size, bool write, bool atomic, void *return_address) {
    if (!g.checking) return;
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(address);
    const std::uintptr_t shared = a - reinterpret_cast<std::uintptr_t>(g.arena);
    if (shared < kArenaBytes) {
        shared_access(shared, size, write, atomic, pc_offset(return_address));
        return;
    }
    for (int i = 0; i < g.nactive; ++i) {
        Buffer &b = *g.active[i];
        if (a - reinterpret_cast<std::uintptr_t>(b.zone_lo) < b.zone_span) {
            global_access(b, static_cast<char *>(address), size, write, atomic, pc_offset(return_address));
            return;
        }
    }
    if (Buffer *variable = variable_at(a))
        global_access(*variable, static_cast<char *>(address), size, write, atomic, pc_offset(return_address));
}

// ---------------------------------------------------------------------------------------------------------
// Metrics, gathered in the first few blocks of each launch.

// A window is the stretch of a block between two barriers (or its start, or its end).
void close_window() {
    if (!g.measuring) return;
    Counts &counts = g.counts[g.launch.kernel_id];
    // Shared-memory requests: the k-th access of each lane of a warp at one code address is one warp-wide
    // request. Each of its phases needs as many transactions as the most distinct words that fall into one bank;
    // a request counts as many requests as it has phases that access memory, so a request without a conflict
    // takes one transaction a request whatever its width.
    std::sort(g.records.begin(), g.records.end(), [](const SharedRecord &a, const SharedRecord &b) {
        if (a.pc != b.pc) return a.pc < b.pc;
        if (a.warp != b.warp) return a.warp < b.warp;
        if (a.seq != b.seq) return a.seq < b.seq;
        if (a.phase != b.phase) return a.phase < b.phase;
        return a.word < b.word;
    });
    unsigned long long per_warp[kMaxThreads / 32] = {};  // warp-wide requests of each warp in this window
    const auto same_request = [](const SharedRecord &a, const SharedRecord &b) {
        return a.pc == b.pc && a.warp == b.warp && a.seq == b.seq;
    };
    for (std::size_t i = 0; i < g.records.size();) {
        auto &m = g.metrics[{g.launch.kernel_id, g.records[i].pc}];
        per_warp[g.records[i].warp]++;
        std::size_t j = i;
        while (j < g.records.size() && same_request(g.records[j], g.records[i])) {
            const std::size_t phase_start = j;
            unsigned int per_bank[32] = {};
            unsigned int previous = UINT32_MAX;
            for (; j < g.records.size() && same_request(g.records[j], g.records[i]) &&
                   g.records[j].phase == g.records[phase_start].phase;
                 ++j) {
                if (g.records[j].word != previous) per_bank[g.records[j].word % 32]++;
                previous = g.records[j].word;
            }
            m.first += 1;
            m.second += *std::max_element(per_bank, per_bank + 32);
        }
        i = j;
    }
    g.records.clear();
    // Requests one warp made alone: the busiest warp's beyond the next busiest's. A tree step that several warps
    // share adds nothing; a last warp that reduces in shared memory while the others wait adds its steps, whatever
    // barriers come after it.
    std::partial_sort(per_warp, per_warp + 2, per_warp + kMaxThreads / 32, std::greater<>());
    counts.lone_shared_requests += per_warp[0] - per_warp[1];
    // Global loads: a warp request reads its distinct words from as many 32-byte sectors as they fall into.
    // Only requests of at least 32 words count (a whole warp's floats): a partial warp says nothing of the
    // access pattern.
    std::sort(g.global_records.begin(), g.global_records.end(), [](const GlobalRecord &a, const GlobalRecord &b) {
        if (a.pc != b.pc) return a.pc < b.pc;
        if (a.warp != b.warp) return a.warp < b.warp;
        if (a.seq != b.seq) return a.seq < b.seq;
        return a.word < b.word;
    });
    for (std::size_t i = 0; i < g.global_records.size();) {
        const GlobalRecord &first = g.global_records[i];
        std::uintptr_t word = UINTPTR_MAX, sector = UINTPTR_MAX;
        unsigned long long words = 0, sectors = 0;
        for (; i < g.global_records.size() && g.global_records[i].pc == first.pc &&
               g.global_records[i].warp == first.warp && g.global_records[i].seq == first.seq;
             ++i) {
            words += g.global_records[i].word != word;
            sectors += g.global_records[i].word / 8 != sector;
            word = g.global_records[i].word;
            sector = word / 8;
        }
        if (words < 32) continue;
        counts.global_requests++;
        counts.global_words += words;
        counts.global_sectors += sectors;
    }
    g.global_records.clear();
    g.sequence.clear();
    // Divergence: a warp-step diverged when the lanes that ran took different paths since the last barrier.
    auto &d = g.divergence[g.launch.kernel_id];
    for (unsigned int w = 0; w * 32 < g.nthreads; ++w) {
        bool any = false, diverged = false;
        std::uint64_t path = 0;
        for (unsigned int i = w * 32; i < std::min(g.nthreads, w * 32 + 32); ++i) {
            Thread &t = g.threads[i];
            if (!t.ran) continue;
            if (any && t.path != path) diverged = true;
            path = t.path;
            any = true;
            t.ran = false;
            t.path = 0;
        }
        d.first += any;
        d.second += diverged;
        counts.diverged += diverged;
    }
}

// ---------------------------------------------------------------------------------------------------------
// The scheduler.

void thread_body() {
    Thread &t = me();
    (g.checking ? g.launch.checked : g.launch.fast)(g.launch.args);
    t.wait = EXITED;
    if (t.last_global_write && t.last_fence > t.last_global_write) {
        const std::uint64_t number = my_thread_number();
        if (g.published.size() <= number / 64) g.published.resize(number / 64 + 1);
        g.published[number / 64] |= 1ull << (number % 64);
    }
    for (;;) Fiber::suspend();
}

void resume(int i) {
    g.current = i;
    threadIdx = g.threads[i].idx;
    g.fibers[i].resume();
}

std::string lanes_text(const std::vector<unsigned int> &tids) {
    std::string text;
    for (std::size_t i = 0; i < tids.size();) {
        std::size_t j = i;
        while (j + 1 < tids.size() && tids[j + 1] == tids[j] + 1) ++j;
        char part[32];
        if (j == i) std::snprintf(part, sizeof part, "%u", tids[i]);
        else std::snprintf(part, sizeof part, "%u-%u", tids[i], tids[j]);
        if (!text.empty()) text += ", ";
        text += part;
        i = j + 1;
    }
    return text;
}

const char *collective_name(int op) {
    static const char *names[] = {"__syncwarp()", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                  "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync",
                                  "__match_any_sync", "__match_all_sync"};
    return names[op];
}

void report_deadlock() {
    // Group the waiting threads by what they wait for and where.
    std::map<std::pair<int, int>, std::vector<unsigned int>> groups;  // (line, op or -1 for barrier) -> tids
    for (unsigned int i = 0; i < g.nthreads; ++i) {
        const Thread &t = g.threads[i];
        if (t.wait == AT_BARRIER) groups[{t.line, -1}].push_back(t.tid);
        if (t.wait == AT_WARP) groups[{t.line, t.op}].push_back(t.tid);
    }
    std::string summary;
    for (const auto &[where, tids] : groups) {
        char part[160];
        std::snprintf(part, sizeof part, "%sthreads %s wait at %s on {line:%d}", summary.empty() ? "" : "; ",
                      lanes_text(tids).c_str(), where.second < 0 ? "__syncthreads()" : collective_name(where.second),
                      where.first);
        summary += part;
    }
    for (const auto &[where, tids] : groups) {
        char message[512];
        std::snprintf(message, sizeof message,
                      "deadlock in block (%u,%u,0): %s. A barrier needs every thread of the block and a warp "
                      "collective every lane of its mask, so none of them can go on",
                      blockIdx.x, blockIdx.y, summary.c_str());
        report(DEADLOCK, where.first, 0, describe_thread(g.threads[tids[0]]), message);
    }
}

unsigned int exited_lanes(unsigned int warp) {
    unsigned int mask = 0;
    for (unsigned int lane = 0; lane < 32; ++lane) {
        const unsigned int i = warp * 32 + lane;
        if (i >= g.nthreads || g.threads[i].wait == EXITED) mask |= 1u << lane;
    }
    return mask;
}

unsigned long long source_value(unsigned int warp, const Thread &t, unsigned int arrived) {
    const int width = (t.width > 0 && t.width <= 32 && (t.width & (t.width - 1)) == 0) ? t.width : 32;
    const unsigned int segment = t.lane & ~static_cast<unsigned int>(width - 1);
    unsigned int source = t.lane;
    switch (t.op) {
        case SHFL: source = segment + (static_cast<unsigned int>(t.arg) % width); break;
        case SHFL_UP: source = (t.lane - segment) >= static_cast<unsigned int>(t.arg) ? t.lane - t.arg : t.lane; break;
        case SHFL_DOWN:
            source = (t.lane - segment) + t.arg < static_cast<unsigned int>(width) ? t.lane + t.arg : t.lane;
            break;
        case SHFL_XOR: {
            const unsigned int x = t.lane ^ static_cast<unsigned int>(t.arg);
            source = x < segment + width ? x : t.lane;
            break;
        }
    }
    source &= 31;
    if (!((arrived & t.mask) >> source & 1u)) {
        char message[400];
        std::snprintf(message, sizeof message,
                      "lane %u reads lane %u in %s on {line:%d}, but lane %u is not taking part (it has exited, "
                      "is elsewhere, or is not in the mask 0x%08x): the value is undefined",
                      t.lane, source, collective_name(t.op), t.line, source, t.mask);
        report(INACTIVE_LANE, t.line, 0, describe_thread(t), message);
        return t.value;
    }
    return g.threads[warp * 32 + source].value;
}

// The lanes of `t`'s mask that took part with the same value as `t` (bit for bit, as __match_*_sync compare).
unsigned int matching(unsigned int warp, const Thread &t, unsigned int arrived) {
    unsigned int lanes = 0;
    for (unsigned int lane = 0; lane < 32; ++lane)
        if ((arrived & t.mask) >> lane & 1u && g.threads[warp * 32 + lane].value == t.value) lanes |= 1u << lane;
    return lanes;
}

// Complete the warp collective of `warp` if every lane it needs has arrived. Returns whether it did.
bool complete_collective(unsigned int warp) {
    unsigned int arrived = 0, needed = 0;
    for (unsigned int lane = 0; lane < 32; ++lane) {
        const unsigned int i = warp * 32 + lane;
        if (i < g.nthreads && g.threads[i].wait == AT_WARP) {
            arrived |= 1u << lane;
            needed |= g.threads[i].mask;
        }
    }
    if (!arrived) return false;
    needed &= ~exited_lanes(warp);
    if ((needed & arrived) != needed) return false;
    unsigned long long ballot = 0, sum = 0, least = UINT32_MAX, most = 0;
    for (unsigned int lane = 0; lane < 32; ++lane) {
        if (!(arrived >> lane & 1u)) continue;
        const unsigned long long v = g.threads[warp * 32 + lane].value;
        ballot |= static_cast<unsigned long long>(v != 0) << lane;
        sum += static_cast<unsigned int>(v);
        least = std::min(least, v & 0xffffffffu);
        most = std::max(most, v & 0xffffffffu);
    }
    // Every participant's clock ticks, then each learns the clocks of the lanes its own mask names that took
    // part: that is the happens-before edge the race checker sees for __syncwarp() and shuffles. A lane whose
    // mask names only itself learns nothing (`__syncwarp(1u << lane)` orders nothing), and a lane its own mask
    // leaves out calls the collective with undefined results.
    for (unsigned int lane = 0; lane < 32; ++lane) {
        if (!(arrived >> lane & 1u)) continue;
        Thread &t = g.threads[warp * 32 + lane];
        t.clock[lane]++;
        if (!(t.mask >> lane & 1u)) {
            char message[400];
            std::snprintf(message, sizeof message,
                          "lane %u calls %s on {line:%d} with the mask 0x%08x, which leaves it out: a lane must "
                          "name itself in its mask, and CUDA leaves the result undefined",
                          lane, collective_name(t.op), t.line, t.mask);
            report(INACTIVE_LANE, t.line, 0, describe_thread(t), message);
        }
    }
    std::uint32_t joined[32][32] = {};
    for (unsigned int lane = 0; lane < 32; ++lane) {
        if (!(arrived >> lane & 1u)) continue;
        const unsigned int group = arrived & (g.threads[warp * 32 + lane].mask | 1u << lane);
        for (unsigned int other = 0; other < 32; ++other) {
            if (!(group >> other & 1u)) continue;
            const Thread &o = g.threads[warp * 32 + other];
            for (int k = 0; k < 32; ++k) joined[lane][k] = std::max(joined[lane][k], o.clock[k]);
        }
    }
    for (unsigned int lane = 0; lane < 32; ++lane) {
        if (!(arrived >> lane & 1u)) continue;
        Thread &t = g.threads[warp * 32 + lane];
        const unsigned long long group = ballot & t.mask;
        switch (t.op) {
            case SYNCWARP: t.result = 0; break;
            case BALLOT: t.result = group; break;
            case ANY: t.result = group != 0; break;
            case ALL: t.result = group == (arrived & t.mask); break;
            case REDUCE_ADD: t.result = static_cast<unsigned int>(sum); break;
            case REDUCE_MIN: t.result = least; break;
            case REDUCE_MAX: t.result = most; break;
            case MATCH_ANY: t.result = matching(warp, t, arrived); break;
            case MATCH_ALL: t.result = matching(warp, t, arrived) == (arrived & t.mask) ? t.mask : 0; break;
            default: t.result = source_value(warp, t, arrived); break;
        }
    }
    const int op = g.threads[warp * 32 + static_cast<unsigned int>(__builtin_ctz(arrived))].op;
    if (g.measuring && op >= SHFL && op <= SHFL_XOR) g.counts[g.launch.kernel_id].shuffles++;
    for (unsigned int lane = 0; lane < 32; ++lane) {
        if (!(arrived >> lane & 1u)) continue;
        Thread &t = g.threads[warp * 32 + lane];
        std::memcpy(t.clock, joined[lane], sizeof joined[lane]);
        t.wait = RUNNABLE;
    }
    return true;
}

// A barrier that part of the block skips: threads that were running when the previous barrier released (or
// the block started) exited without arriving, or waited at another __syncthreads(). The runtime releases it
// as a GPU does (PTX counts only the threads that have not exited), but CUDA leaves a __syncthreads() in code
// that the block does not run alike undefined: it may hang or misbehave on another GPU or compiler. Only a
// block's first such barrier is reported: after it, the threads' barriers no longer pair up.
void check_barrier_divergence(unsigned int exited) {
    std::map<long long, std::pair<int, unsigned int>> at_site;  // barrier -> (its line, threads waiting there)
    for (unsigned int i = 0; i < g.nthreads; ++i) {
        const Thread &t = g.threads[i];
        if (t.wait == AT_BARRIER) {
            at_site[t.site].first = t.line;
            at_site[t.site].second++;
        }
    }
    const unsigned int skipped = exited - g.exited_at_release;
    if (g.block_diverged || (!skipped && at_site.size() == 1)) return;
    g.block_diverged = true;
    for (const auto &[site, here] : at_site) {
        const auto [line, arrived] = here;
        std::string others;
        char part[96];
        if (skipped) {
            std::snprintf(part, sizeof part, "; %u exited without reaching it", skipped);
            others += part;
        }
        for (const auto &[other, there] : at_site) {
            if (other == site) continue;
            std::snprintf(part, sizeof part, "; %u waited at %s__syncthreads() on {line:%d} instead", there.second,
                          there.first == line ? "another " : "the ", there.first);
            others += part;
        }
        char message[512];
        std::snprintf(message, sizeof message,
                      "__syncthreads() on {line:%d} was reached by only %u of the %u running threads of block "
                      "(%u,%u,0)%s. A barrier that part of the block skips is undefined in CUDA (it may hang or "
                      "go wrong on another GPU or compiler): put it where every thread of the block passes",
                      line, arrived, g.nthreads - g.exited_at_release, blockIdx.x, blockIdx.y, others.c_str());
        for (unsigned int i = 0; i < g.nthreads; ++i) {
            if (g.threads[i].wait == AT_BARRIER && g.threads[i].site == site) {
                report(BARRIER_DIVERGENCE, line, 0, describe_thread(g.threads[i]), message);
                break;
            }
        }
    }
}

bool release_barrier() {
    unsigned int waiting = 0, exited = 0, count = 0;
    for (unsigned int i = 0; i < g.nthreads; ++i) {
        waiting += g.threads[i].wait == AT_BARRIER;
        exited += g.threads[i].wait == EXITED;
        count += g.threads[i].wait == AT_BARRIER && g.threads[i].value;
    }
    if (!waiting || waiting + exited != g.nthreads) return false;
    if (g.checking) check_barrier_divergence(exited);
    g.exited_at_release = exited;
    close_window();
    if (g.measuring) g.counts[g.launch.kernel_id].barriers++;
    g.epoch++;
    for (unsigned int i = 0; i < g.nthreads; ++i) {
        Thread &t = g.threads[i];
        if (t.wait != AT_BARRIER) continue;
        t.wait = RUNNABLE;
        t.result = t.op == 0 ? count : t.op == 1 ? count == waiting : count != 0;
    }
    return true;
}

void make_order() {
    g.order.resize(g.nthreads);
    for (unsigned int i = 0; i < g.nthreads; ++i) g.order[i] = static_cast<int>(i);
    if (g.schedule == REVERSED) std::reverse(g.order.begin(), g.order.end());
    if (g.schedule == RANDOM) std::shuffle(g.order.begin(), g.order.end(), g.rng);
}

// Runs one block. Returns false on a deadlock.
bool run_block(unsigned int bx, unsigned int by) {
    blockIdx = {bx, by, 0};
    g.block_linear = by * g.launch.grid[0] + bx;
    g.block_gen++;
    g.epoch = 0;
    g.exited_at_release = 0;
    g.block_diverged = false;
    g.block_acquired = false;
    poison_shared_memory();
    const std::size_t slot = kStackBytes + 4096;
    for (unsigned int i = 0; i < g.nthreads; ++i) {
        Thread &t = g.threads[i];
        t = Thread{};
        t.idx = {i % g.launch.block[0], i / g.launch.block[0], 0};
        t.tid = i;
        t.lane = i % 32;
        t.warp = i / 32;
        g.fibers[i].start(g.stacks + i * slot + 4096, kStackBytes, &thread_body);
    }
    make_order();
    for (;;) {
        bool ran = true;
        while (ran) {
            ran = false;
            for (int i : g.order) {
                if (g.threads[i].wait != RUNNABLE) continue;
                resume(i);
                ran = true;
            }
            if (ran && g.schedule == RANDOM) std::shuffle(g.order.begin(), g.order.end(), g.rng);
        }
        bool progressed = false;
        for (unsigned int w = 0; w * 32 < g.nthreads; ++w) progressed |= complete_collective(w);
        if (progressed) continue;
        if (release_barrier()) continue;
        bool all_exited = true;
        for (unsigned int i = 0; i < g.nthreads; ++i) all_exited &= g.threads[i].wait == EXITED;
        if (all_exited) break;
        report_deadlock();
        return false;
    }
    close_window();
    if (g.measuring) {
        Counts &counts = g.counts[g.launch.kernel_id];
        counts.blocks++;
        // The shared-memory accesses of the block's busiest thread: a tree gives each thread a few a round, a
        // thread that adds its block's values alone one a value.
        unsigned long long busiest = 0;
        for (unsigned int i = 0; i < g.nthreads; ++i) busiest = std::max(busiest, g.threads[i].shared_accesses);
        counts.busiest_thread_shared += busiest;
    }
    return true;
}

template <class T>
T apply_atomic(T old, int op, T value, T compare) {
    switch (op) {
        case A_ADD: return old + value;
        case A_SUB: return old - value;
        case A_EXCH: return value;
        case A_MIN: return std::min(old, value);
        case A_MAX: return std::max(old, value);
        case A_CAS: return old == compare ? value : old;
        default: break;
    }
    if constexpr (std::is_integral_v<T>) {
        switch (op) {
            case A_AND: return old & value;
            case A_OR: return old | value;
            case A_XOR: return old ^ value;
            case A_INC: return old >= value ? 0 : old + 1;
            case A_DEC: return (old == 0 || old > value) ? value : old - 1;
        }
    }
    return old;
}

template <class T>
unsigned long long atomic_as(void *address, int op, unsigned long long value, unsigned long long compare) {
    T old, v, c;
    std::memcpy(&old, address, sizeof(T));
    std::memcpy(&v, &value, sizeof(T));
    std::memcpy(&c, &compare, sizeof(T));
    const T updated = apply_atomic<T>(old, op, v, c);
    std::memcpy(address, &updated, sizeof(T));
    unsigned long long bits = 0;
    std::memcpy(&bits, &old, sizeof(T));
    return bits;
}

// ---------------------------------------------------------------------------------------------------------
// __device__ variables, read from the kernel library's symbol table (the file the grader built and loaded).

// A name without its namespaces, template arguments or return type: `void ns::f<256u>` is `f`.
std::string last_identifier(std::string name) {
    if (const std::size_t angle = name.find('<'); angle != std::string::npos) name.resize(angle);
    const std::size_t cut = name.find_last_of(": ");
    return cut == std::string::npos ? name : name.substr(cut + 1);
}

// A variable's name for messages: demangled, without namespaces or template arguments; a function's static as
// `function::variable` (`void f<256u>(float*)::buf` is `f::buf`).
std::string declared_name(const char *symbol) {
    int status = 0;
    char *demangled = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
    const std::string name = status == 0 && demangled ? demangled : symbol;
    std::free(demangled);
    const std::size_t open = name.find('(');
    if (open == std::string::npos) return last_identifier(name);
    const std::size_t colons = name.rfind("::");
    if (name.rfind("guard variable for ", 0) == 0 || colons == std::string::npos || colons < open) return "";
    return last_identifier(name.substr(0, open)) + "::" + name.substr(colons + 2);
}

// Each data symbol of `file` (an ELF shared object of `bytes`) named in `wanted`, as a Buffer at `base`: its
// span reaches to the next symbol of its section, or the section's end, so an access in its padding is outside
// it. Symbols of other names bound nothing but the spans. Whatever the file holds, nothing outside it is read.
std::vector<Buffer *> variables_in(const unsigned char *file, std::size_t bytes, std::uintptr_t base,
                                   const std::set<std::string> &wanted) {
    std::vector<Buffer *> found;
    const auto inside = [bytes](std::uint64_t offset, std::uint64_t size) {
        return offset <= bytes && size <= bytes - offset;
    };
    if (bytes < sizeof(Elf64_Ehdr)) return found;
    const auto *header = reinterpret_cast<const Elf64_Ehdr *>(file);
    if (std::memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 || header->e_ident[EI_CLASS] != ELFCLASS64 ||
        header->e_shentsize != sizeof(Elf64_Shdr) ||
        !inside(header->e_shoff, std::uint64_t{header->e_shnum} * sizeof(Elf64_Shdr)))
        return found;
    const auto *sections = reinterpret_cast<const Elf64_Shdr *>(file + header->e_shoff);
    for (unsigned int t = 0; t < header->e_shnum; ++t) {
        const Elf64_Shdr &table = sections[t];
        if (table.sh_type != SHT_SYMTAB || table.sh_entsize != sizeof(Elf64_Sym) || table.sh_link >= header->e_shnum ||
            !inside(table.sh_offset, table.sh_size))
            continue;
        const Elf64_Shdr &names = sections[table.sh_link];
        if (!inside(names.sh_offset, names.sh_size) || names.sh_size == 0 || file[names.sh_offset + names.sh_size - 1])
            continue;
        const auto *symbols = reinterpret_cast<const Elf64_Sym *>(file + table.sh_offset);
        const std::size_t count = table.sh_size / sizeof(Elf64_Sym);
        for (std::size_t i = 0; i < count; ++i) {
            const Elf64_Sym &v = symbols[i];
            if (ELF64_ST_TYPE(v.st_info) != STT_OBJECT || v.st_size == 0 || v.st_shndx == SHN_UNDEF ||
                v.st_shndx >= header->e_shnum || v.st_name >= names.sh_size)
                continue;
            const Elf64_Shdr &home = sections[v.st_shndx];
            if (!(home.sh_flags & SHF_ALLOC) || (home.sh_flags & SHF_EXECINSTR) || v.st_value < home.sh_addr ||
                v.st_value - home.sh_addr > home.sh_size || v.st_size > home.sh_addr + home.sh_size - v.st_value)
                continue;
            const char *symbol = reinterpret_cast<const char *>(file + names.sh_offset + v.st_name);
            if (!wanted.count(symbol)) continue;
            std::string name = declared_name(symbol);
            if (name.empty()) name = symbol;  // a name that does not read as one (`cell<&(operator<(A, A))>`)
            std::uint64_t end = home.sh_addr + home.sh_size;
            for (std::size_t j = 0; j < count; ++j) {
                const Elf64_Sym &other = symbols[j];
                if (other.st_shndx == v.st_shndx && other.st_value >= v.st_value + v.st_size && other.st_value < end)
                    end = other.st_value;
            }
            auto *b = new Buffer{};
            b->data = b->zone_lo = reinterpret_cast<char *>(base + v.st_value);
            b->zone_span = end - v.st_value;
            b->count = (v.st_size + 3) / 4;
            if (const std::size_t colons = name.find("::"); colons == std::string::npos) {
                b->name = name;
                b->what = "the __device__ variable " + name;
            } else {
                b->name = name.substr(colons + 2);
                b->what = "the static variable " + b->name + " of " + name.substr(0, colons) +
                          " (in global memory: one for every block and launch)";
            }
            found.push_back(b);
        }
    }
    std::sort(found.begin(), found.end(), [](const Buffer *a, const Buffer *b) { return a->data < b->data; });
    return found;
}

}  // namespace ag

using namespace ag;

// ---------------------------------------------------------------------------------------------------------
// What the prelude calls.

#pragma GCC visibility push(default)
extern "C" {

void __ag_syncthreads(int line, int site) {
    Thread &t = me();
    t.wait = AT_BARRIER;
    t.line = line;
    t.site = static_cast<long long>(line) << 32 | static_cast<unsigned int>(site);
    t.op = 0;
    t.value = 0;
    Fiber::suspend();
}

int __ag_syncthreads_op(int line, int op, int predicate, int site) {
    Thread &t = me();
    t.wait = AT_BARRIER;
    t.line = line;
    t.site = static_cast<long long>(line) << 32 | static_cast<unsigned int>(site);
    t.op = op;
    t.value = predicate != 0;
    Fiber::suspend();
    return static_cast<int>(t.result);
}

unsigned long long __ag_warp(int line, int op, unsigned int mask, unsigned long long value, int arg, int width) {
    Thread &t = me();
    t.wait = AT_WARP;
    t.line = line;
    t.op = op;
    t.mask = mask;
    t.value = value;
    t.arg = arg;
    t.width = width;
    Fiber::suspend();
    return t.result;
}

void __ag_threadfence(void) { me().last_fence = ++g.sequence_number; }

unsigned int __ag_activemask(void) { return ~exited_lanes(me().warp); }

// The dynamic shared memory, for an `extern __shared__` array at namespace scope (the rewrite passes the marker
// that names it, which the compiler then keeps beside it: compiler.device_variables).
unsigned char *__ag_dynamic_shared_of(const char *) { return __ag_dynamic_shared; }

void *__ag_static_shared(unsigned long size, unsigned long align, const char *name) {
    if (!ensure_arena()) return nullptr;
    StaticLayout &layout = g.layouts[library_base(__builtin_return_address(0))];
    // At least 16: the rewrite drops `__align__(16)` and the like, and such a float array may be read as float4.
    align = std::max(align, 16UL);
    // A 64-byte gap between arrays, so running off one array is out of bounds, not inside the next.
    std::size_t offset = kDynamicSharedMax + ((layout.used + 64 + align - 1) / align) * align;
    if (offset + size > kArenaBytes) {
        std::fprintf(stderr, "CPU backend: more than %zu bytes of static __shared__ memory\n", kStaticSharedMax);
        std::abort();
    }
    layout.arrays.push_back({offset, size, name});
    layout.used = offset + size - kDynamicSharedMax;
    std::memset(g.arena + offset, kSharedPoison, size);  // allocated in the middle of a block: as it started
    return g.arena + offset;
}

unsigned long long __ag_atomic(void *address, int size, int op, int type, unsigned long long value,
                               unsigned long long compare) {
    on_access(address, static_cast<std::size_t>(size), true, true, __builtin_return_address(0));
    const std::uintptr_t offset = reinterpret_cast<std::uintptr_t>(address) - reinterpret_cast<std::uintptr_t>(g.arena);
    if (offset >= kArenaBytes) g.block_acquired = true;  // an atomic outside shared memory: global or __device__
    // Fibers switch only at runtime calls, so a plain read-modify-write is atomic here.
    if (type == T_FLOAT) return atomic_as<float>(address, op, value, compare);
    if (type == T_DOUBLE) return atomic_as<double>(address, op, value, compare);
    if (size == 8) return type == T_INT ? atomic_as<long long>(address, op, value, compare)
                                        : atomic_as<unsigned long long>(address, op, value, compare);
    return type == T_INT ? atomic_as<int>(address, op, value, compare)
                         : atomic_as<unsigned int>(address, op, value, compare);
}

// ---------------------------------------------------------------------------------------------------------
// GCC's ThreadSanitizer and coverage hooks (the de-facto ABI shared by GCC and Clang; tests pin the names).

#define AG_HOOKS(n)                                                                                      \
    void __tsan_read##n(void *a) { on_access(a, n, false, false, __builtin_return_address(0)); }          \
    void __tsan_write##n(void *a) { on_access(a, n, true, false, __builtin_return_address(0)); }         \
    void __tsan_unaligned_read##n(void *a) { on_access(a, n, false, false, __builtin_return_address(0)); } \
    void __tsan_unaligned_write##n(void *a) { on_access(a, n, true, false, __builtin_return_address(0)); } \
    void __tsan_volatile_read##n(void *a) { on_access(a, n, false, false, __builtin_return_address(0)); }  \
    void __tsan_volatile_write##n(void *a) { on_access(a, n, true, false, __builtin_return_address(0)); }  \
    void __tsan_unaligned_volatile_read##n(void *a) { on_access(a, n, false, false, __builtin_return_address(0)); } \
    void __tsan_unaligned_volatile_write##n(void *a) { on_access(a, n, true, false, __builtin_return_address(0)); }
AG_HOOKS(1)
AG_HOOKS(2)
AG_HOOKS(4)
AG_HOOKS(8)
AG_HOOKS(16)
#undef AG_HOOKS

void __tsan_read_range(void *a, unsigned long size) {
    if (size) on_access(a, size, false, false, __builtin_return_address(0));
}
void __tsan_write_range(void *a, unsigned long size) {
    if (size) on_access(a, size, true, false, __builtin_return_address(0));
}
// A kernel's calls of memcpy and memmove, which the instrumented build links here (-Wl,--wrap): GCC's
// instrumentation leaves a copy whose size it cannot see to the C library, where no hook saw its accesses (a
// __device__ flag read through memcpy was state kept between launches that no check found: red team).
static void copy_access(void *to, const void *from, std::size_t size, void *return_address) {
    if (!size) return;
    on_access(const_cast<void *>(from), size, false, false, return_address);
    on_access(to, size, true, false, return_address);
}
void *__wrap_memcpy(void *to, const void *from, std::size_t size) {
    copy_access(to, from, size, __builtin_return_address(0));
    return std::memcpy(to, from, size);
}
void *__wrap_memmove(void *to, const void *from, std::size_t size) {
    copy_access(to, from, size, __builtin_return_address(0));
    return std::memmove(to, from, size);
}
void __tsan_init(void) {}
void __tsan_func_entry(void *) {}
void __tsan_func_exit(void) {}
void __tsan_vptr_update(void **, void *) {}
void __tsan_vptr_read(void **) {}

void __sanitizer_cov_trace_pc(void) {
    if (!g.measuring) return;
    Thread &t = me();
    t.path = (t.path ^ reinterpret_cast<std::uintptr_t>(__builtin_return_address(0))) * 0x100000001b3ULL;
    t.ran = true;
}

// ---------------------------------------------------------------------------------------------------------
// API for Python.

int ag_abi_version(void) { return 1; }
const char *ag_fibers(void) { return AG_FIBERS; }
const char *ag_error(void) { return g.error.c_str(); }

void ag_configure(int metrics_blocks, long long full_check_threads, int sample_blocks) {
    g.metrics_blocks = metrics_blocks;
    g.full_check_threads = full_check_threads;
    g.sample_blocks = sample_blocks;
}

// The launches that follow run only these blocks (linear numbers), each checked, and measured where `measured`,
// until called with none: the timing size's analysis, where the grader draws the blocks (autograder.at_scale).
void ag_run_only(const long long *blocks, long long count, int measured) {
    g.only.assign(blocks, blocks + count);
    g.only_measured = measured != 0;
}

void *ag_alloc(unsigned long long count, unsigned long long guard) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t data_bytes = ((count + guard) * 4 + page - 1) / page * page;
    const std::size_t total = page + kRedZoneBytes + data_bytes + kRedZoneBytes + page;
    char *base = static_cast<char *>(map_memory(total));
    if (!base) return nullptr;
    // Guard pages beyond the red zones: an access that wild faults (the worker process reports it).
    mprotect(base, page, PROT_NONE);
    mprotect(base + total - page, page, PROT_NONE);
    auto *b = new Buffer{};
    b->zone_lo = base + page;
    b->zone_span = kRedZoneBytes + data_bytes + kRedZoneBytes;
    b->data = base + page + kRedZoneBytes;
    b->count = count;
    b->guard = guard;
    b->map_bytes = total;
    g.buffers[b->data] = b;
    return b->data;
}

void ag_free(void *data) {
    auto it = g.buffers.find(data);
    if (it == g.buffers.end()) return;
    Buffer *b = it->second;
    if (b->cells) munmap(b->cells, (b->count + b->guard) * sizeof(Cell));
    munmap(b->zone_lo - sysconf(_SC_PAGESIZE), b->map_bytes);
    g.buffers.erase(it);
    delete b;
}

// API: check the __device__ variables whose symbols `names` holds (one a line: compiler.device_variables) of the
// kernel library holding `code`, in every launch of its instrumented build. Returns how many were found, -1 where
// the library's file could not be read.
int ag_watch_variables(const void *code, const char *names) {
    Dl_info info{};
    if (!code || !dladdr(code, &info) || !info.dli_fname) return -1;
    const auto base = reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    if (const auto known = g.variables.find(base); known != g.variables.end())
        return static_cast<int>(known->second.size());
    std::set<std::string> wanted;
    for (const char *line = names; *line;) {
        const char *end = std::strchr(line, '\n');
        wanted.emplace(line, end ? end : line + std::strlen(line));
        line = end ? end + 1 : line + std::strlen(line);
    }
    const int fd = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat status {};
    void *file = fstat(fd, &status) == 0 && status.st_size > 0
                     ? mmap(nullptr, static_cast<std::size_t>(status.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
                     : MAP_FAILED;
    close(fd);
    if (file == MAP_FAILED) return -1;
    g.variables[base] = variables_in(static_cast<const unsigned char *>(file), static_cast<std::size_t>(status.st_size),
                                     base, wanted);
    munmap(file, static_cast<std::size_t>(status.st_size));
    return static_cast<int>(g.variables[base].size());
}

// The blocks of a launch that feed the metrics: `metrics_blocks` of those it checks (all, or the first and last
// `sample_blocks` of a sampled launch), drawn from its measure seed, which a grading run derives from its secret
// seed and the launch's shape alone (the same launch, the same blocks, whatever ran before it): a kernel cannot
// keep its technique to the blocks it knows are measured (the first ones, say).
std::set<long long> measured_blocks(long long blocks, bool sampled, std::uint64_t seed) {
    const long long candidates = sampled ? 2LL * g.sample_blocks : blocks;
    std::set<long long> chosen;
    std::mt19937_64 draw(seed ^ 0x9E3779B97F4A7C15ULL);  // not the schedule's generator, which it would move
    std::uniform_int_distribution<long long> any(0, candidates - 1);
    while (static_cast<long long>(chosen.size()) < std::min<long long>(g.metrics_blocks, candidates)) {
        const long long pick = any(draw);
        chosen.insert(sampled && pick >= g.sample_blocks ? blocks - 2LL * g.sample_blocks + pick : pick);
    }
    return chosen;
}

// The blocks between the first and last `sample_blocks` of a sampled launch that it checks too: as many again,
// drawn from its measure seed (the grading run's secret), so a kernel cannot keep a race or a stray access to
// the blocks it knows run unchecked (all those between, or a few of them chosen by a launch's size).
std::set<long long> spot_blocks(long long blocks, std::uint64_t seed) {
    const long long first = g.sample_blocks, last = blocks - g.sample_blocks;  // the unchecked range [first, last)
    std::set<long long> chosen;
    if (last <= first) return chosen;
    std::mt19937_64 draw(seed ^ 0xD1B54A32D192ED03ULL);  // neither the schedule's generator nor the metrics'
    std::uniform_int_distribution<long long> any(first, last - 1);
    while (static_cast<long long>(chosen.size()) < std::min<long long>(g.sample_blocks, last - first))
        chosen.insert(any(draw));
    return chosen;
}

// Returns 0 when the launch ran, 1 on a deadlock, -1 when it could not start, -2 when it ran but its checks
// could not all be made (see ag_error).
int ag_launch(const AgLaunch *launch) {
    g.launch = *launch;
    g.schedule = static_cast<Schedule>(launch->schedule);
    g.rng.seed(launch->seed);
    g.nthreads = launch->block[0] * launch->block[1];
    if (!ensure_arena()) {
        g.error = "could not map memory for the shared arena and fiber stacks";
        return -1;
    }
    if (g.nthreads == 0 || g.nthreads > kMaxThreads || launch->grid[0] == 0 || launch->grid[1] == 0) {
        g.error = "invalid launch configuration: a block holds 1 to 1024 threads and a grid at least one block";
        return -1;
    }
    if (launch->shared_bytes > kDynamicSharedMax) {
        g.error = "more dynamic shared memory than a GPU offers";
        return -1;
    }
    blockDim = {launch->block[0], launch->block[1], 1};
    gridDim = {launch->grid[0], launch->grid[1], 1};
    g.launch_gen++;
    g.seen.clear();
    g.stray_write_told = false;
    g.unchecked.clear();
    g.published.clear();
    g.nactive = 0;
    for (int k = 0; k < launch->nargs && g.nactive < 8; ++k) {
        auto it = g.buffers.find(*static_cast<void **>(launch->args[k]));
        if (it == g.buffers.end()) continue;
        it->second->arg = k;
        g.active[g.nactive++] = it->second;
    }
    g.pc_base = library_base(reinterpret_cast<void *>(launch->checked));
    const auto variables = g.variables.find(g.pc_base);
    g.launch_variables = launch->checked && variables != g.variables.end() ? &variables->second : nullptr;
    g.launch_layouts[0] = launch->checked ? &g.layouts[g.pc_base] : nullptr;
    g.launch_layouts[1] = launch->fast ? &g.layouts[library_base(reinterpret_cast<void *>(launch->fast))] : nullptr;
    // Fresh, zeroed fiber stacks: an uninitialised local variable never sees what an earlier kernel left.
    madvise(g.stacks, (kStackBytes + 4096) * kMaxThreads, MADV_DONTNEED);
    const long long blocks = static_cast<long long>(launch->grid[0]) * launch->grid[1];
    // Large launches check the first and last blocks fully, and as many drawn between them, and run the other
    // blocks uninstrumented.
    const bool sampled = launch->checked && launch->fast && blocks * g.nthreads > g.full_check_threads;
    const std::set<long long> measured = measured_blocks(blocks, sampled, launch->measure_seed);
    const std::set<long long> spot = sampled ? spot_blocks(blocks, launch->measure_seed) : std::set<long long>{};
    int status = 0;
    for (long long b = 0; b < blocks && status == 0 && g.only.empty(); ++b) {
        const bool checked = launch->checked && (!sampled || b < g.sample_blocks || b >= blocks - g.sample_blocks
                                                 || spot.count(b));
        g.checking = checked;
        g.measuring = checked && measured.count(b);
        if (!run_block(static_cast<unsigned int>(b % launch->grid[0]), static_cast<unsigned int>(b / launch->grid[0])))
            status = 1;
    }
    for (std::size_t i = 0; i < g.only.size() && status == 0; ++i) {
        const long long b = g.only[i];
        if (b < 0 || b >= blocks) continue;
        g.checking = launch->checked != nullptr;
        g.measuring = g.checking && g.only_measured;
        if (!run_block(static_cast<unsigned int>(b % launch->grid[0]), static_cast<unsigned int>(b / launch->grid[0])))
            status = 1;
    }
    g.checking = g.measuring = false;
    std::fflush(stdout);  // a kernel's printf shows at the end of the launch, as on a GPU
    if (status == 0 && !g.unchecked.empty()) {  // a deadlock is the kernel's verdict, whatever was left unchecked
        g.error = g.unchecked;
        return -2;
    }
    return status;
}

int ag_finding_count(void) { return static_cast<int>(g.findings.size()); }
const AgFinding *ag_finding(int i) { return &g.findings[static_cast<std::size_t>(i)]; }
void ag_clear_findings(void) { g.findings.clear(); }

// Copies up to `capacity` per-line metrics of one kernel into `out`; returns how many it has.
int ag_metrics(int kernel_id, AgMetric *out, int capacity) {
    int count = 0;
    for (auto it = g.metrics.lower_bound({kernel_id, 0}); it != g.metrics.end() && it->first.kernel_id == kernel_id;
         ++it, ++count)
        if (count < capacity) out[count] = {kernel_id, it->first.pc, it->second.first, it->second.second};
    return count;
}
void ag_divergence(int kernel_id, unsigned long long *steps, unsigned long long *diverged) {
    auto &d = g.divergence[kernel_id];
    *steps = d.first;
    *diverged = d.second;
}
// The Counts of one kernel, in their order: blocks, barriers, diverged warp steps, shuffles, final shared
// requests, the whole-warp global load requests, their sectors and words, the busiest thread's shared-memory
// accesses and the shared-memory atomics.
void ag_counts(int kernel_id, unsigned long long *out) {
    const Counts &c = g.counts[kernel_id];
    const unsigned long long values[] = {c.blocks,   c.barriers,        c.diverged,       c.shuffles,
                                         c.lone_shared_requests, c.global_requests, c.global_sectors,
                                         c.global_words, c.busiest_thread_shared, c.shared_atomics};
    std::memcpy(out, values, sizeof values);
}

}  // extern "C"
#pragma GCC visibility pop
