#include "thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace rk {
namespace {

// Workers sleep on a condition variable between jobs. A job is a chunked range; every
// participant (the caller included) takes chunks from an atomic counter until none are left.
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
        // A new worker has seen every job so far: only a later generation wakes it (starting from
        // 0 it would run a phantom job and drive active_ below zero, hanging the next run).
        for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this, seen = generation_] { worker_loop(seen); });
    }

    void run(int64_t n_chunks, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
        std::lock_guard<std::mutex> job_guard(job_mutex_);  // one job at a time
        {
            std::lock_guard<std::mutex> lk(mutex_);
            fn_ = &fn;
            n_ = n;
            grain_ = grain;
            n_chunks_ = n_chunks;
            next_chunk_ = 0;
            active_ = int(workers_.size());
            error_ = nullptr;
            ++generation_;
        }
        cv_.notify_all();
        work();
        std::unique_lock<std::mutex> lk(mutex_);
        done_cv_.wait(lk, [this] { return active_ == 0; });
        fn_ = nullptr;
        if (error_) std::rethrow_exception(error_);
    }

  private:
    void work() {
        for (;;) {
            int64_t c = next_chunk_.fetch_add(1);
            if (c >= n_chunks_) return;
            int64_t begin = c * grain_, end = std::min(n_, begin + grain_);
            try {
                (*fn_)(begin, end);
            } catch (...) {
                std::lock_guard<std::mutex> lk(mutex_);
                if (!error_) error_ = std::current_exception();
            }
        }
    }

    void worker_loop(uint64_t seen) {
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(mutex_);
                cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
                if (stopping_) return;
                seen = generation_;
            }
            work();
            {
                std::lock_guard<std::mutex> lk(mutex_);
                if (--active_ == 0) done_cv_.notify_one();
            }
        }
    }

    void stop_workers() {
        {
            std::lock_guard<std::mutex> lk(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        for (auto& w : workers_) w.join();
        workers_.clear();
    }

    std::vector<std::thread> workers_;
    std::mutex job_mutex_, mutex_;
    std::condition_variable cv_, done_cv_;
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
    int64_t n_ = 0, grain_ = 1, n_chunks_ = 0;
    std::atomic<int64_t> next_chunk_{0};
    int active_ = 0;
    uint64_t generation_ = 0;
    bool stopping_ = false;
    std::exception_ptr error_;
};

int default_threads() {
    unsigned hc = std::thread::hardware_concurrency();
    return hc ? int(hc) : 1;
}

ThreadPool& pool() {
    static ThreadPool p(default_threads());
    return p;
}

thread_local bool in_parallel_region = false;

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
        for (int64_t c = 0; c < chunks; ++c) fn(c * grain, std::min(n, (c + 1) * grain));
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
