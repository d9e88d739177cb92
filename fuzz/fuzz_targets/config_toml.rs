//! The configuration loader on arbitrary TOML text (through a file, as
//! `--config` reads it): never a panic; a rejection always names at least
//! one problem.
#![no_main]

use std::sync::OnceLock;

use app_bootstrap::{AppConfig, ConfigSources};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"));
    let path = dir.path().join("fuzz.toml");
    std::fs::write(&path, data).expect("write the file");
    match AppConfig::load(&ConfigSources::new(Some(path))) {
        Ok(_) => {}
        Err(error) => assert!(!error.to_string().is_empty(), "an empty error"),
    }
});
