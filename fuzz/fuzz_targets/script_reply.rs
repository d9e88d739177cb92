//! RESP bytes -> `redis::Value` -> the script reply decoder: never panics;
//! whatever it accepts is a reply of five elements it can print.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(decoded) = adapter_redis::fuzz_decode_script_reply(data) {
        assert!(decoded.starts_with("ScriptReply"), "{decoded}");
    }
});
