//! Work spread over the node's cores: `check` and `renew` handle a few dozen independent files
//! (read, parse, verify a signature, make a key), so each worker takes the next item as it
//! finishes. Scoped threads from std; no pool, no dependency.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Most workers ever started: the work is a few dozen items.
const MAX_WORKERS: usize = 8;

/// The CPUs this process may run on (its affinity mask: one system call, where std's
/// `available_parallelism` also reads the cgroup files), at least 1.
pub fn cpus() -> usize {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .count()
            .max(1),
        Err(_) => 1,
    }
}

/// `items.iter().map(f).collect()`, with the items spread over up to `workers` threads (the
/// calling thread is one of them), results in the items' order. A worker that panics panics the
/// caller (as the sequential map would).
pub fn map<T: Sync, R: Send>(items: &[T], workers: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = workers.clamp(1, MAX_WORKERS).min(items.len());
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            done.push((i, f(item)));
        }
        done
    };
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let others: Vec<_> = (1..workers).map(|_| scope.spawn(work)).collect();
        let mut all = work();
        for handle in others {
            match handle.join() {
                Ok(done) => all.extend(done),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (i, r) in all {
            slots[i] = Some(r);
        }
    });
    // Every index below `items.len()` was taken by exactly one worker, which returned.
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_covers_every_item() {
        let items: Vec<u64> = (0..257).collect();
        for workers in [0, 1, 2, 3, 8, 64] {
            let out = map(&items, workers, |x| {
                // Unequal work, so that workers finish out of order.
                std::thread::sleep(std::time::Duration::from_micros(x % 7 * 20));
                x * 3
            });
            assert_eq!(
                out,
                items.iter().map(|x| x * 3).collect::<Vec<_>>(),
                "{workers}"
            );
        }
        assert!(map(&[] as &[u8], 4, |x| *x).is_empty());
        assert!(cpus() >= 1);
    }

    #[test]
    #[should_panic(expected = "boom")]
    fn a_panicking_worker_panics_the_caller() {
        let items: Vec<u32> = (0..16).collect();
        map(&items, 4, |x| {
            if *x == 9 {
                panic!("boom");
            }
            *x
        });
    }
}
