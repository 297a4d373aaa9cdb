//! One answer from a committer thread to one writer, which waits for it
//! either as a blocked thread ([`Receiver::wait`]) or as a task awaiting it
//! ([`Receiver`] is a future): a run on a thread of its own does the first,
//! a run executed as a task the second, and the committer need not know
//! which.
//!
//! The sender wakes the receiver only if it is waiting: no system call when
//! the answer comes first.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// A new channel for one answer.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        closed: false,
        waiting: None,
    }));
    (Sender(slot.clone()), Receiver(slot))
}

struct Slot<T> {
    value: Option<T>,
    /// The sender is gone (with or without an answer).
    closed: bool,
    /// Who to wake when the answer comes: a task's waker, or one that
    /// unparks a blocked thread.
    waiting: Option<Waker>,
}

fn lock<T>(slot: &Mutex<Slot<T>>) -> MutexGuard<'_, Slot<T>> {
    // Nothing panics while holding the lock but a waker's own code, which
    // runs outside it.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// The committer's end.
pub struct Sender<T>(Arc<Mutex<Slot<T>>>);

impl<T> Sender<T> {
    pub fn send(self, value: T) {
        lock(&self.0).value = Some(value);
        // Dropping wakes the receiver.
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waiting = {
            let mut slot = lock(&self.0);
            slot.closed = true;
            slot.waiting.take()
        };
        if let Some(waker) = waiting {
            waker.wake();
        }
    }
}

/// The writer's end: `None` if the committer went away without answering.
pub struct Receiver<T>(Arc<Mutex<Slot<T>>>);

impl<T> Receiver<T> {
    /// Blocks this thread until the answer comes.
    pub fn wait(self) -> Option<T> {
        let mut waker = None;
        loop {
            {
                let mut slot = lock(&self.0);
                if slot.value.is_some() || slot.closed {
                    return slot.value.take();
                }
                let waker = waker
                    .get_or_insert_with(|| Waker::from(Arc::new(Unpark(std::thread::current()))));
                slot.waiting = Some(waker.clone());
            }
            // A wake-up between the unlock and here is kept by the thread's
            // token: the park returns at once.
            std::thread::park();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = lock(&self.0);
        if slot.value.is_some() || slot.closed {
            return Poll::Ready(slot.value.take());
        }
        match &slot.waiting {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => slot.waiting = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// Wakes a thread blocked in [`Receiver::wait`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_thread_gets_the_answer_sent_from_another() {
        let (sender, receiver) = channel();
        let answering = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            sender.send(42);
        });
        assert_eq!(receiver.wait(), Some(42));
        answering.join().unwrap();
    }

    #[test]
    fn an_answer_sent_first_is_there_and_a_sender_gone_is_none() {
        let (sender, receiver) = channel();
        sender.send("done");
        assert_eq!(receiver.wait(), Some("done"));
        let (sender, receiver) = channel::<u8>();
        drop(sender);
        assert_eq!(receiver.wait(), None);
    }

    #[test]
    fn an_awaiting_task_is_woken_by_the_answer() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (sender, receiver) = channel();
        let answering = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            sender.send(7);
        });
        assert_eq!(runtime.block_on(receiver), Some(7));
        answering.join().unwrap();
        let (sender, receiver) = channel::<u8>();
        let dropping = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(sender);
        });
        assert_eq!(runtime.block_on(receiver), None);
        dropping.join().unwrap();
    }
}
