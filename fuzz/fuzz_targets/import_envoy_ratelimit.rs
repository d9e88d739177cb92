//! `ca-skeleton-import envoy-ratelimit`'s converter on arbitrary YAML text: never a
//! panic; a refusal names a problem; what it prints loads as a
//! configuration as it is (through a file, as `--config` reads it).
#![no_main]

use std::sync::OnceLock;

use app_bootstrap::{AppConfig, ConfigSources};
use import_envoy_ratelimit::{ImportError, Source, convert};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let Ok(text) = std::str::from_utf8(data) else { return };
    match convert(&[Source { name: "fuzz.yaml", text }]) {
        Ok(imported) => {
            let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"));
            let path = dir.path().join("imported.toml");
            std::fs::write(&path, &imported.toml).expect("write the file");
            if let Err(error) = AppConfig::load(&ConfigSources::new(Some(path))) {
                panic!("the import does not load: {error}\n{}", imported.toml);
            }
        }
        Err(ImportError { problems }) => assert!(!problems.is_empty(), "no problem"),
    }
});
