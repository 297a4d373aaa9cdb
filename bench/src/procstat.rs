//! CPU time from Linux's `/proc` stat files, read by the bench and by the
//! `hot` example (which includes this file).

/// The name and CPU time (µs) in a `/proc` `stat` file: utime and stime,
/// in clock ticks of 10 ms (USER_HZ = 100 on Linux), coarse, so what is
/// measured should last seconds.
pub fn cpu_of(stat: &str) -> Option<(String, f64)> {
    split_of(stat).map(|(name, user, kernel)| (name, user + kernel))
}

/// The name, and the CPU time (µs) in user space and in the kernel, in a
/// `/proc` `stat` file.
fn split_of(stat: &str) -> Option<(String, f64, f64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    // The fields after the command name, which is in parentheses: utime
    // and stime are fields 14 and 15 of the line, 12 and 13 after `)`.
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let us = |i: usize| fields.get(i)?.parse::<f64>().ok().map(|ticks| ticks * 1e4);
    Some((stat[open + 1..close].to_string(), us(11)?, us(12)?))
}

/// CPU time (µs) of this process in user space and in the kernel, apart
/// (the bench's; the `hot` example, which includes this file, needs only
/// the sum).
#[allow(dead_code)]
pub fn process_cpu_split_us() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    split_of(&stat).map(|(_, user, kernel)| (user, kernel))
}

/// CPU time (µs) of this process: every thread's, those that ended too.
pub fn process_cpu_us() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_of(&stat).map(|(_, us)| us)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stat_line_gives_its_name_and_cpu() {
        // A command name with a space and a parenthesis, as the kernel
        // allows; utime 250 and stime 50 ticks.
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        let (name, us) = super::cpu_of(stat).unwrap();
        assert_eq!(name, "a (b) c");
        assert_eq!(us, 3_000_000.0);
        assert!(super::cpu_of("42 (x) S 1").is_none());
    }
}
