//! Who holds a claim: `host/pid/start-time`, so that a successor on the same
//! machine can tell a dead owner (its process is gone) from a live one
//! without waiting for the lease to run out. Owners on other machines are
//! taken to be alive until their lease expires.

/// This process's owner name.
pub fn this_process() -> String {
    let pid = std::process::id();
    format!(
        "{}/{pid}/{}",
        hostname(),
        start_time(pid).unwrap_or_default()
    )
}

/// Whether the owner named by `owner` may still be running.
pub fn is_alive(owner: &str) -> bool {
    let mut parts = owner.rsplitn(3, '/');
    let (Some(start), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
        return true;
    };
    if host != hostname() {
        return true;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return true;
    };
    match start_time(pid) {
        Some(now) => now.to_string() == start,
        // No such process on this machine: the owner is dead.
        None => !std::path::Path::new("/proc/self/stat").exists(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "localhost".to_string())
}

/// The process start time in clock ticks since boot (field 22 of
/// `/proc/PID/stat`), which tells a process from a later one with its pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; it ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_finished_child_is_not() {
        assert!(is_alive(&this_process()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid);
        child.wait().unwrap();
        let owner = format!("{}/{pid}/{}", hostname(), start.unwrap_or(1));
        assert!(!is_alive(&owner));
    }

    #[test]
    fn owners_on_other_hosts_are_taken_to_be_alive() {
        assert!(is_alive("some-other-host/1/1"));
    }
}
