//! Python's way of printing values, for templates written against jinja2.
//!
//! jinja2 prints `True`/`False`/`None` and Python reprs of lists and dicts; HF's `tojson` is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, whose
//! default separators are `", "` and `": "` (`","` between items when indenting).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `str(value)` as jinja2 prints it in `{{ ... }}`.
pub(crate) fn py_str(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Map => py_repr(out, v),
        _ => py_scalar(out, v),
    }
}

fn py_scalar(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if !v.is_integer() => match f64::try_from(v.clone()) {
            Ok(f) => out.push_str(&py_float(f)),
            Err(_) => {
                let _ = write!(out, "{v}");
            }
        },
        _ => {
            let _ = write!(out, "{v}");
        }
    }
}

/// `repr(value)` for lists, dicts and scalars inside them.
fn py_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            let quote = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            out.push(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        let _ = write!(out, "\\x{:02x}", c as u32);
                    }
                    c => out.push(c),
                }
            }
            out.push(quote);
        }
        ValueKind::Seq => {
            out.push('[');
            if let Ok(iter) = v.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = v.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &key);
                    out.push_str(": ");
                    py_repr(out, &v.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => py_scalar(out, v),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form below 1e-4 and from 1e16.
pub(crate) fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's `{:?}` is the shortest round-trip form with the same switch points as Python,
    // but writes exponents as `1e-5` / `1e16` where Python writes `1e-05` / `1e+16`.
    let s = format!("{f:?}");
    match s.split_once('e') {
        None => s,
        Some((mant, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let mant = mant.strip_suffix(".0").unwrap_or(mant);
            format!("{mant}e{sign}{digits:0>2}")
        }
    }
}

/// Options of HF's `tojson` filter.
struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            if s.chars().count() > MAX_SEPARATOR_CHARS {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: an indent string longer than {MAX_SEPARATOR_CHARS} characters"
                    ),
                ));
            }
            Some(s.to_string())
        }
        Some(v) => {
            let n = v.as_usize().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                )
            })?;
            Some(" ".repeat(n.min(64)))
        }
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.iter().any(|x| x.chars().count() > MAX_SEPARATOR_CHARS) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a separator longer than {MAX_SEPARATOR_CHARS} characters"),
            ))
        }
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be (item_separator, key_separator)",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

/// Longest indent or separator `tojson` takes (real templates use a few spaces).
const MAX_SEPARATOR_CHARS: usize = 64;

/// Most items `tojson` serialises from one list or map (a list repeated with `*` is lazy and
/// can claim billions).
const MAX_JSON_ITEMS: usize = 1 << 22;

fn too_large() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: output larger than {} bytes or more than {MAX_JSON_ITEMS} items in one list",
            crate::chat::MAX_RENDERED_BYTES
        ),
    )
}

fn write_json(out: &mut String, v: &Value, o: &JsonOpts, depth: usize) -> Result<(), Error> {
    crate::chat::check_deadline()?;
    if out.len() > crate::chat::MAX_RENDERED_BYTES {
        return Err(too_large());
    }
    if depth > 128 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: nesting too deep",
        ));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&match py_float(f).as_str() {
                "nan" => "NaN".to_string(),
                "inf" => "Infinity".to_string(),
                "-inf" => "-Infinity".to_string(),
                s => s.to_string(),
            });
        }
        ValueKind::String => json_string(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.take(MAX_JSON_ITEMS + 1).collect();
            if items.len() > MAX_JSON_ITEMS {
                return Err(too_large());
            }
            write_container(out, o, depth, '[', ']', &items, |out, item| {
                write_json(out, item, o, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in v.try_iter()?.take(MAX_JSON_ITEMS + 1) {
                if pairs.len() == MAX_JSON_ITEMS {
                    return Err(too_large());
                }
                let value = v.get_item(&key)?;
                pairs.push((json_key(&key)?, value));
            }
            if o.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, o, depth, '{', '}', &pairs, |out, (k, val)| {
                json_string(out, k, o.ensure_ascii);
                out.push_str(&o.key_sep);
                write_json(out, val, o, depth + 1)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {kind}"),
            ))
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    o: &JsonOpts,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if out.len() > crate::chat::MAX_RENDERED_BYTES {
            return Err(too_large());
        }
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..=depth {
                out.push_str(ind);
            }
        }
        each(out, item)?;
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
    out.push(close);
    Ok(())
}

/// Python's json.dumps turns str, int, float, bool and None keys into strings.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::Number => {
            let mut s = String::new();
            py_scalar(&mut s, key);
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be strings, not {kind}"),
            ))
        }
    })
}

fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected strings are Python's repr() of the same floats.
    #[test]
    fn float_repr_matches_python() {
        for (f, py) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e300, "1.5e+300"),
            (-2.25e-7, "-2.25e-07"),
        ] {
            assert_eq!(py_float(f), py, "{f}");
        }
    }
}
