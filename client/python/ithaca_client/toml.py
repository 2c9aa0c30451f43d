"""Job specs as TOML: `dumps` writes a dict (of str, bool, int, float, lists and nested dicts) as
TOML text that tomllib reads back equal, and `value_text` one value (an override's). The daemon
takes the spec as TOML text, and applies overrides itself; Python's standard library reads TOML
but does not write it."""
import math
import re

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k):
    if not isinstance(k, str):
        raise TypeError(f"TOML keys are strings, got {k!r}")
    return k if _BARE_KEY.match(k) else _string(k)


def _string(s):
    out = ['"']
    for c in s:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _value(v, where):
    if isinstance(v, bool):  # before int: bool is an int
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # shortest text that reads back the same double; has "." or "e"
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, dict):  # a table inside an array, or below a scalar's level
        return "{" + ", ".join(f"{_key(k)} = {_value(x, where + '.' + str(k))}"
                               for k, x in v.items()) + "}"
    raise TypeError(f"{where}: cannot write {type(v).__name__} as TOML")


def dumps(spec):
    """TOML text of `spec`: top-level scalars first, then one [table] per nested dict."""
    if not isinstance(spec, dict):
        raise TypeError(f"a spec is a dict, got {type(spec).__name__}")
    lines = []
    _table(spec, [], lines)
    return "\n".join(lines) + "\n"


def _table(d, path, lines):
    scalars = [(k, v) for k, v in d.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in d.items() if isinstance(v, dict)]
    if path and (scalars or not tables):
        if lines:
            lines.append("")
        lines.append("[" + ".".join(_key(k) for k in path) + "]")
    for k, v in scalars:
        if v is None:
            raise TypeError(f"{'.'.join(path + [k])}: None has no TOML form; leave the key out")
        lines.append(f"{_key(k)} = {_value(v, '.'.join(path + [k]))}")
    for k, v in tables:
        _table(v, path + [k], lines)


def value_text(value, key):
    """The TOML text of one value (for an override "KEY=VALUE"); TypeError naming `key`."""
    return _value(value, key)
