use std::ffi::OsString;
use std::path::PathBuf;

use crate::StoreError;

/// The flowrt data directory: `$FLOWRT_HOME`, else `$XDG_DATA_HOME/flowrt`, else
/// `$HOME/.local/share/flowrt`. Empty variables count as unset, and a relative
/// `XDG_DATA_HOME` is ignored (as the XDG spec asks).
pub fn flowrt_home() -> Result<PathBuf, StoreError> {
    home_from(
        std::env::var_os("FLOWRT_HOME"),
        std::env::var_os("XDG_DATA_HOME"),
        std::env::var_os("HOME"),
    )
}

/// [`flowrt_home`] with the three variables passed in.
pub(crate) fn home_from(
    flowrt_home: Option<OsString>,
    xdg_data_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf, StoreError> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(flowrt_home) {
        return Ok(dir);
    }
    if let Some(dir) = set(xdg_data_home).filter(|d| d.is_absolute()) {
        return Ok(dir.join("flowrt"));
    }
    if let Some(dir) = set(home) {
        return Ok(dir.join(".local").join("share").join("flowrt"));
    }
    Err(StoreError::NoHome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<OsString> {
        Some(v.into())
    }

    #[test]
    fn precedence_without_touching_the_environment() {
        let h = |a, b, c| home_from(a, b, c).map_err(|e| e.to_string());
        assert_eq!(h(s("/f"), s("/x"), s("/h")), Ok("/f".into()));
        assert_eq!(h(None, s("/x"), s("/h")), Ok("/x/flowrt".into()));
        assert_eq!(h(s(""), s("/x"), s("/h")), Ok("/x/flowrt".into()));
        assert_eq!(
            h(None, s("rel"), s("/h")),
            Ok("/h/.local/share/flowrt".into())
        );
        assert_eq!(h(None, None, s("/h")), Ok("/h/.local/share/flowrt".into()));
        let err = h(None, s(""), None).unwrap_err();
        assert!(err.contains("FLOWRT_HOME"), "{err}");
    }
}
