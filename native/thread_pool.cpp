#include "thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <sys/resource.h>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace rk {
namespace {

// Workers sleep on a condition variable between jobs. A job is a chunked range; every
// participant (the caller included) takes chunks from the job's atomic counter until none are
// left, and the caller returns once every chunk is done, not once every worker has checked in:
// on a machine with more runnable threads than cores a worker may not run for a whole
// scheduler slice, and the caller then does the chunks itself instead of waiting for it (a
// 2-thread update went from 0.65 ms to 64 ms under two busy processes when it waited). A worker
// that wakes late holds its own reference to the job it woke for and finds no chunk left.
// Set on a thread while it runs chunks of a job: the caller for the job's length, a worker for
// its whole life. A parallel_for on such a thread runs inline: a nested job would wait on the
// job lock its own caller holds.
thread_local bool in_parallel_region = false;

// How long a worker keeps checking for the next job after the last one it helped with, before
// it sleeps on its condition variable. A sleeping thread's virtual CPU halts, and under a
// hypervisor waking it took ~100 us: on this 2-core VM, 32 chunks totalling 200 us of work, 200
// us after the previous job, took 209 us on average (the worker hardly ever started in time), and
// 106 us with a spinning worker; a captured update runs dozens of parallel ops a few us apart.
// Bounded, yielding as it checks, and skipped where the machine is oversubscribed
// (preempted_lately). The caller does not spin for the worker's last chunks: beside busy
// processes that cost more than it saved.
constexpr auto kSpinFor = std::chrono::microseconds(300);

// Whether this thread was preempted (switched out involuntarily) since its last call: the machine
// then has more runnable threads than cores, where spinning takes CPU time from them and, by the
// scheduler's fairness, from this process's own next job (beside two busy processes, a job of
// 1 ms of work on 2 threads took 1.6 ms on average with a worker that always spins, 1.1 without,
// 1.0-1.2 skipping the spin after a preemption).
bool preempted_lately() {
#ifdef RUSAGE_THREAD
    thread_local long seen = -1;
    rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) != 0) return true;
    const bool preempted = usage.ru_nivcsw != seen;
    seen = usage.ru_nivcsw;
    return preempted;
#else
    return false;  // no per-thread counts on this system (RUSAGE_THREAD is Linux's): always spin
#endif
}

// Returns once done() is true or `until` has passed; at once where the thread was preempted lately.
template <typename Done>
void spin_until(const Done& done, std::chrono::steady_clock::time_point until) {
    if (std::chrono::steady_clock::now() >= until || preempted_lately()) return;
    do {
        for (int i = 0; i < 64; ++i) {
            if (done()) return;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        std::this_thread::yield();
    } while (std::chrono::steady_clock::now() < until);
}

struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;  // alive while chunks remain
    int64_t n = 0, grain = 1, n_chunks = 0;
    std::atomic<int64_t> next_chunk{0}, done_chunks{0};
    std::exception_ptr error;  // the first exception of a chunk (guarded by the pool's mutex)
};

class ThreadPool {
  public:
    explicit ThreadPool(int n) { resize(n); }
    ~ThreadPool() { stop_workers(); }

    int size() const { return int(workers_.size()) + 1; }

    void resize(int n) {
        n = std::max(1, n);
        if (n == size()) return;
        stop_workers();
        stopping_ = false;
        wake_ = std::make_unique<std::condition_variable[]>(size_t(n - 1));
        for (int i = 0; i < n - 1; ++i)
            workers_.emplace_back([this, i, seen = generation_.load()] { worker_loop(i, seen); });
    }

    void run(int64_t n_chunks, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
        std::lock_guard<std::mutex> job_guard(job_mutex_);  // one job at a time
        auto job = std::make_shared<Job>();
        job->fn = &fn;
        job->n = n;
        job->grain = grain;
        job->n_chunks = n_chunks;
        // Helpers: one per chunk beyond the caller's, at most every worker, and always the same
        // ones, workers 0 to helpers - 1. The rest stay asleep or spinning. All 15 workers of a
        // 16-thread pool had woken for every op, most of which have 2 blocks, and whichever came
        // first took the second block: SAC trained at 106-111 steps/s on 16 threads against
        // 144-152 on 2, each woken worker queueing on mutex_, and each op's block read on
        // another core than the one that wrote it in the op before.
        const int64_t helpers = std::min<int64_t>(n_chunks - 1, int64_t(workers_.size()));
        {
            std::lock_guard<std::mutex> lk(mutex_);
            job_ = job;
            helpers_.store(helpers);
            ++generation_;
        }
        for (int64_t i = 0; i < helpers; ++i) wake_[i].notify_one();  // the others sleep on
        work(*job);
        std::unique_lock<std::mutex> lk(mutex_);
        done_cv_.wait(lk, [&] { return job->done_chunks.load() == n_chunks; });
        job_.reset();
        if (job->error) std::rethrow_exception(job->error);
    }

  private:
    void work(Job& job) {
        for (;;) {
            const int64_t c = job.next_chunk.fetch_add(1);
            if (c >= job.n_chunks) return;
            const int64_t begin = c * job.grain, end = begin + std::min(job.grain, job.n - begin);  // no overflow past n
            try {
                (*job.fn)(begin, end);
            } catch (...) {
                std::lock_guard<std::mutex> lk(mutex_);
                if (!job.error) job.error = std::current_exception();
            }
            if (job.done_chunks.fetch_add(1) + 1 == job.n_chunks) {
                std::lock_guard<std::mutex> lk(mutex_);  // the caller checks under the lock: no lost wake-up
                done_cv_.notify_one();
            }
        }
    }

    // Worker `index` helps with the jobs that want more than `index` helpers. It spins for kSpinFor
    // after the last job it helped with, and then sleeps until a job wants it: jobs for fewer
    // helpers neither wake it nor prolong its spin. Spinning on every job, the 14 workers of a
    // 16-thread pool that SAC's 2-block ops never want had kept 14 cores busy for nothing.
    void worker_loop(int64_t index, uint64_t seen) {
        in_parallel_region = true;
        auto spin_end = std::chrono::steady_clock::now() + kSpinFor;
        for (;;) {
            spin_until([&] { return generation_.load() != seen; }, spin_end);
            // A job for fewer helpers is skipped without the lock. The generation is read first:
            // where a newer job has come since, its count is what this reads, or the generation
            // changes again after `seen`.
            const uint64_t now = generation_.load();
            if (now != seen && index >= helpers_.load()) {
                seen = now;
                continue;
            }
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> lk(mutex_);
                wake_[index].wait(lk, [&] { return stopping_ || (generation_ != seen && index < helpers_); });
                if (stopping_) return;
                seen = generation_;
                job = job_;  // null when the caller already finished it
            }
            if (job) work(*job);
            spin_end = std::chrono::steady_clock::now() + kSpinFor;
        }
    }

    void stop_workers() {
        {
            std::lock_guard<std::mutex> lk(mutex_);
            stopping_ = true;
        }
        for (size_t i = 0; i < workers_.size(); ++i) wake_[i].notify_all();
        for (auto& w : workers_) w.join();
        workers_.clear();
    }

    std::vector<std::thread> workers_;
    std::mutex job_mutex_, mutex_;
    std::unique_ptr<std::condition_variable[]> wake_;  // worker i sleeps on wake_[i] (with mutex_)
    std::condition_variable done_cv_;
    std::shared_ptr<Job> job_;  // the job running now
    std::atomic<uint64_t> generation_{0};  // changed under mutex_, read without it while spinning
    std::atomic<int64_t> helpers_{0};  // how many workers the job posted last wants (changed under mutex_)
    bool stopping_ = false;
};

int default_threads() {
    unsigned hc = std::thread::hardware_concurrency();
    return hc ? int(hc) : 1;
}

ThreadPool& pool() {
    static ThreadPool p(default_threads());
    return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
    if (n < 1) throw std::invalid_argument("set_num_threads: n must be at least 1, got " + std::to_string(n));
    pool().resize(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    int64_t chunks = chunk_count(n, grain);
    if (chunks == 1 || pool().size() == 1 || in_parallel_region) {
        for (int64_t c = 0; c < chunks; ++c) fn(c * grain, c * grain + std::min(grain, n - c * grain));
        return;
    }
    in_parallel_region = true;
    try {
        pool().run(chunks, n, grain, fn);
    } catch (...) {
        in_parallel_region = false;
        throw;
    }
    in_parallel_region = false;
}

}  // namespace rk
