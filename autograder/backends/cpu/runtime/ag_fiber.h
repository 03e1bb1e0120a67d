// The fiber primitive of the CPU backend: Boost.Context's fcontext (a switch costs a few nanoseconds), or
// glibc's ucontext where Boost is missing or AG_UCONTEXT is defined (about 40 times slower per switch: it
// saves the signal mask with a system call).
//
// The scheduler runs on the OS thread's own stack and resumes one fiber at a time; a fiber always switches
// back to the scheduler, never to another fiber. A fiber that is abandoned (a deadlocked block) is never
// unwound: its stack is simply reused by the next block.
#pragma once

#include <cstddef>

#if !defined(AG_UCONTEXT) && __has_include(<boost/context/detail/fcontext.hpp>)
#include <boost/context/detail/fcontext.hpp>
#define AG_FIBERS "boost.context"

namespace ag {
namespace bctx = boost::context::detail;

class Fiber {
  public:
    void start(void *stack_lo, std::size_t size, void (*body)()) {
        body_ = body;
        context_ = bctx::make_fcontext(static_cast<char *>(stack_lo) + size, size, &Fiber::trampoline);
    }
    // Called by the scheduler: run this fiber until it switches back.
    void resume() {
        current_ = this;
        context_ = bctx::jump_fcontext(context_, nullptr).fctx;
    }
    // Called inside the fiber: go back to the scheduler.
    static void suspend() { scheduler_ = bctx::jump_fcontext(scheduler_, nullptr).fctx; }

  private:
    static void trampoline(bctx::transfer_t from) {
        scheduler_ = from.fctx;
        current_->body_();  // never returns: the body ends by suspending for good
    }
    bctx::fcontext_t context_ = nullptr;
    void (*body_)() = nullptr;
    static inline bctx::fcontext_t scheduler_ = nullptr;
    static inline Fiber *current_ = nullptr;
};
}  // namespace ag

#else
#ifdef AG_REQUIRE_BOOST
#error "Boost.Context (boost/context/detail/fcontext.hpp) is not installed"
#endif
#include <ucontext.h>
#define AG_FIBERS "ucontext"

namespace ag {
class Fiber {
  public:
    void start(void *stack_lo, std::size_t size, void (*body)()) {
        getcontext(&context_);
        context_.uc_stack.ss_sp = stack_lo;
        context_.uc_stack.ss_size = size;
        context_.uc_link = nullptr;
        makecontext(&context_, body, 0);
    }
    void resume() {
        current_ = this;
        swapcontext(&scheduler_, &context_);
    }
    static void suspend() { swapcontext(&current_->context_, &scheduler_); }

  private:
    ucontext_t context_{};
    static inline ucontext_t scheduler_{};
    static inline Fiber *current_ = nullptr;
};
}  // namespace ag
#endif
