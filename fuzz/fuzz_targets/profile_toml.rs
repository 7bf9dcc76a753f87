//! Profile parsing and validation on arbitrary text: a profile is input (it may come from another
//! machine or be edited by hand), so parsing and `validate` must reject, never panic; a profile that
//! validates must survive a round trip through TOML.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiles::Profile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok((profile, _warnings)) = Profile::from_toml(text) else { return };
    if profile.validate(false).is_ok() {
        let again = profile.to_toml().expect("a valid profile serialises");
        let (back, _) = Profile::from_toml(&again).expect("a written profile parses");
        back.validate(false).expect("a written profile validates");
    }
});
