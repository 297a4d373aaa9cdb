//! What a step may import from WASI, decided in one place: every interface
//! the host links is either routed through the journal (recorded, so a
//! replay sees the same), refused (it gives the step nothing of the host's:
//! no files, sockets, environment or terminal), or plumbing that carries
//! only the above. A component importing anything else is refused when it
//! loads (`StepEngine::check_world`), so an ambient capability cannot be
//! added to the linker without being classified here, and the test below
//! pins this list.

/// How the host treats a WASI interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Every call goes through the journal.
    Recorded(&'static str),
    /// Linked so that programs load, but it gives the step nothing.
    Refused(&'static str),
    /// Resources and streams that carry only recorded or refused things.
    Plumbing(&'static str),
}

/// Every WASI interface a step may import (any 0.2 version), and how the
/// host treats it.
pub const WASI: &[(&str, Treatment)] = &[
    (
        "wasi:cli/environment",
        Treatment::Refused("no variables, no arguments, no working directory"),
    ),
    (
        "wasi:cli/exit",
        Treatment::Plumbing("ends the program; a command's status is recorded with its end"),
    ),
    (
        "wasi:cli/stdin",
        Treatment::Refused(
            "empty for a step; a command's stdin is the run's input, recorded with the run",
        ),
    ),
    (
        "wasi:cli/stdout",
        Treatment::Recorded("the run's log, level stdout (a command's stdout is its output)"),
    ),
    (
        "wasi:cli/stderr",
        Treatment::Recorded("the run's log, level stderr"),
    ),
    ("wasi:cli/terminal-input", Treatment::Refused("no terminal")),
    (
        "wasi:cli/terminal-output",
        Treatment::Refused("no terminal"),
    ),
    ("wasi:cli/terminal-stdin", Treatment::Refused("no terminal")),
    (
        "wasi:cli/terminal-stdout",
        Treatment::Refused("no terminal"),
    ),
    (
        "wasi:cli/terminal-stderr",
        Treatment::Refused("no terminal"),
    ),
    (
        "wasi:clocks/wall-clock",
        Treatment::Recorded("each reading an observe call"),
    ),
    (
        "wasi:clocks/monotonic-clock",
        Treatment::Recorded("each reading an observe call; each wait a durable sleep"),
    ),
    (
        "wasi:filesystem/preopens",
        Treatment::Refused("no preopened directories"),
    ),
    (
        "wasi:filesystem/types",
        Treatment::Refused("nothing to open without a preopened directory"),
    ),
    (
        "wasi:http/outgoing-handler",
        Treatment::Recorded(
            "each exchange one call, to granted origins only; a write started durably before \
             it is sent",
        ),
    ),
    (
        "wasi:http/types",
        Treatment::Plumbing("requests, responses and their bodies, for the exchanges above"),
    ),
    (
        "wasi:io/error",
        Treatment::Plumbing("errors of the streams below"),
    ),
    (
        "wasi:io/poll",
        Treatment::Plumbing("pollables that are ready: recorded waits and the streams below"),
    ),
    (
        "wasi:io/streams",
        Treatment::Plumbing("stdin, stdout and stderr, and HTTP bodies, above"),
    ),
    (
        "wasi:random/random",
        Treatment::Recorded("each draw an observe call"),
    ),
    (
        "wasi:random/insecure",
        Treatment::Recorded("each draw an observe call"),
    ),
    (
        "wasi:random/insecure-seed",
        Treatment::Recorded("derived from the run id: the same on every replay"),
    ),
    (
        "wasi:sockets/instance-network",
        Treatment::Refused("TCP, UDP and name lookups are off"),
    ),
    (
        "wasi:sockets/ip-name-lookup",
        Treatment::Refused("name lookups are off"),
    ),
    (
        "wasi:sockets/network",
        Treatment::Refused("TCP, UDP and name lookups are off"),
    ),
    ("wasi:sockets/tcp", Treatment::Refused("TCP is off")),
    (
        "wasi:sockets/tcp-create-socket",
        Treatment::Refused("TCP is off"),
    ),
    ("wasi:sockets/udp", Treatment::Refused("UDP is off")),
    (
        "wasi:sockets/udp-create-socket",
        Treatment::Refused("UDP is off"),
    ),
];

/// How the host treats the import `name` (`wasi:NS/IFACE@VERSION`), if it
/// links it at all.
pub fn treatment(name: &str) -> Option<Treatment> {
    let (interface, version) = name.split_once('@').unwrap_or((name, ""));
    if !version.is_empty() && !version.starts_with("0.2.") {
        return None;
    }
    WASI.iter()
        .find(|(known, _)| *known == interface)
        .map(|(_, treatment)| *treatment)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list, pinned: a change to what a step can reach is a change to
    /// this test.
    #[test]
    fn every_wasi_interface_is_recorded_refused_or_plumbing_and_none_else() {
        let kinds: Vec<String> = WASI
            .iter()
            .map(|(name, t)| {
                let kind = match t {
                    Treatment::Recorded(_) => "recorded",
                    Treatment::Refused(_) => "refused",
                    Treatment::Plumbing(_) => "plumbing",
                };
                format!("{name} {kind}")
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "wasi:cli/environment refused",
                "wasi:cli/exit plumbing",
                "wasi:cli/stdin refused",
                "wasi:cli/stdout recorded",
                "wasi:cli/stderr recorded",
                "wasi:cli/terminal-input refused",
                "wasi:cli/terminal-output refused",
                "wasi:cli/terminal-stdin refused",
                "wasi:cli/terminal-stdout refused",
                "wasi:cli/terminal-stderr refused",
                "wasi:clocks/wall-clock recorded",
                "wasi:clocks/monotonic-clock recorded",
                "wasi:filesystem/preopens refused",
                "wasi:filesystem/types refused",
                "wasi:http/outgoing-handler recorded",
                "wasi:http/types plumbing",
                "wasi:io/error plumbing",
                "wasi:io/poll plumbing",
                "wasi:io/streams plumbing",
                "wasi:random/random recorded",
                "wasi:random/insecure recorded",
                "wasi:random/insecure-seed recorded",
                "wasi:sockets/instance-network refused",
                "wasi:sockets/ip-name-lookup refused",
                "wasi:sockets/network refused",
                "wasi:sockets/tcp refused",
                "wasi:sockets/tcp-create-socket refused",
                "wasi:sockets/udp refused",
                "wasi:sockets/udp-create-socket refused",
            ]
        );
    }

    #[test]
    fn imports_are_matched_by_interface_across_0_2_versions_only() {
        assert!(treatment("wasi:cli/stdout@0.2.0").is_some());
        assert!(treatment("wasi:clocks/wall-clock@0.2.12").is_some());
        assert!(treatment("wasi:http/outgoing-handler@0.2.0").is_some());
        assert_eq!(treatment("wasi:http/incoming-handler@0.2.0"), None);
        assert_eq!(treatment("wasi:cli/stdout@0.3.0"), None);
    }
}
