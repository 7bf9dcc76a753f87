//! One line of the measurement log on arbitrary text: a corrupt line (a crash mid-write, a disk
//! full, a hand edit) must be `None`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        let _ = profiles::measurements::parse_line(line);
    }
});
