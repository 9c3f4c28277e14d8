#include "host_cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <pthread.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define RK_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RK_ADDRESS_SANITIZER 1
#endif
#endif

namespace rk {
namespace {

constexpr size_t kAlign = 64;

// RLKIT_HOST_CACHE_MIB if set (0 keeps nothing), else a sixteenth of the machine's memory, at
// most 2 GiB: a training step's large temporaries, not a second copy of its working set.
size_t budget_from_environment() {
#ifdef RK_ADDRESS_SANITIZER
    return 0;
#else
    if (const char* text = std::getenv("RLKIT_HOST_CACHE_MIB")) {
        char* end = nullptr;
        const unsigned long long mib = std::strtoull(text, &end, 10);
        if (!*text || *end || text[0] == '-' || mib > (size_t(1) << 40))
            throw std::invalid_argument(std::string("RLKIT_HOST_CACHE_MIB must be a whole number of MiB (0 keeps no "
                                                    "freed host memory), got '") + text + "'");
        return size_t(mib) << 20;
    }
    const size_t physical = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
    return std::min(physical / 16, size_t(2) << 30);
#endif
}

class HostCache {
public:
    void* acquire(size_t bytes) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            budget();  // a bad RLKIT_HOST_CACHE_MIB is reported here, by the op that allocates, not in a release
            auto found = by_size_.find(bytes);
            if (found != by_size_.end() && !found->second.empty()) {
                const auto block = found->second.back();  // the most recently kept: warmest in the caches
                found->second.pop_back();
                void* data = block->data;
                kept_bytes_ -= bytes;
                order_.erase(block);
                ++reused_;
                return data;
            }
        }
        if (void* data = std::aligned_alloc(kAlign, bytes)) return data;
        clear();  // the system is short of memory: what is kept goes back before the last try
        return std::aligned_alloc(kAlign, bytes);
    }

    void release(void* data, size_t bytes) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (bytes >= kMinKeptBytes && bytes <= budget()) {
                while (kept_bytes_ + bytes > budget_) evict_oldest();
                order_.push_back({data, bytes});
                by_size_[bytes].push_back(std::prev(order_.end()));
                kept_bytes_ += bytes;
                return;
            }
        }
        std::free(data);
    }

    void clear() {
        std::vector<void*> freed;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (const Block& block : order_) freed.push_back(block.data);
            order_.clear();
            by_size_.clear();
            kept_bytes_ = 0;
        }
        for (void* data : freed) std::free(data);
    }

    void lock() { mutex_.lock(); }
    void unlock() { mutex_.unlock(); }

    HostCacheStats stats() {
        std::lock_guard<std::mutex> lock(mutex_);
        return {budget(), kept_bytes_, order_.size(), reused_};
    }

private:
    struct Block {
        void* data;
        size_t bytes;
    };

    size_t budget() {  // read once, under the lock
        if (!budget_read_) {
            budget_ = budget_from_environment();
            budget_read_ = true;
        }
        return budget_;
    }

    void evict_oldest() {
        const Block oldest = order_.front();
        auto& same_size = by_size_[oldest.bytes];
        same_size.erase(std::find(same_size.begin(), same_size.end(), order_.begin()));
        order_.pop_front();
        kept_bytes_ -= oldest.bytes;
        std::free(oldest.data);
    }

    std::mutex mutex_;
    std::list<Block> order_;  // oldest first
    std::unordered_map<size_t, std::vector<std::list<Block>::iterator>> by_size_;
    size_t kept_bytes_ = 0, reused_ = 0, budget_ = 0;
    bool budget_read_ = false;
};

HostCache& cache();

void lock_for_fork() { cache().lock(); }
void unlock_after_fork() { cache().unlock(); }

// Never destroyed: tensors freed while the process exits still give their blocks back to it.
HostCache& cache() {
    static HostCache* instance = [] {
        auto* created = new HostCache;
        // a fork while another thread holds the lock would leave the child's copy of it locked for good
        pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
        return created;
    }();
    return *instance;
}

}  // namespace

void* host_block_acquire(size_t bytes) { return cache().acquire(bytes); }

void host_block_release(void* block, size_t bytes) { cache().release(block, bytes); }

HostCacheStats host_cache_stats() { return cache().stats(); }

void host_cache_clear() { cache().clear(); }

}  // namespace rk
