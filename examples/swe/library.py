"""The functions the generated repositories are made of, each with its test cases and its bugs.

A `Function` is correct source code, the cases its tests check (argument expressions; the expected
values are computed by running the correct code) and the mutations that inject one bug each
(`Mutation`: a family, a text replacement that occurs exactly once). A task's hidden tests are the
cases a bug gets wrong; the cases it still gets right stay visible (pass-to-pass).
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("off_by_one", "comparison", "arithmetic", "boolean", "constant", "wrong_variable")


@dataclass(frozen=True)
class Mutation:
    family: str
    old: str
    new: str


@dataclass(frozen=True)
class Function:
    name: str
    source: str
    cases: tuple[str, ...]
    mutations: tuple[Mutation, ...]


M = Mutation

MODULES: dict[str, tuple[Function, ...]] = {
    "numbers": (
        Function(
            "clamp",
            '''def clamp(value, low, high):
    """Limit value to the closed interval [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
            ("5, 0, 10", "-3, 0, 10", "12, 0, 10", "0, 0, 10", "10, 0, 10", "7, 7, 7"),
            (
                M("comparison", "if value > high:", "if value < high:"),
                M("wrong_variable", "        return low\n", "        return high\n"),
            ),
        ),
        Function(
            "mean",
            '''def mean(values):
    """Arithmetic mean of a non-empty list of numbers."""
    total = 0
    for v in values:
        total += v
    return total / len(values)
''',
            ("[1, 2, 3]", "[4]", "[2, 2, 2, 2]", "[1, 2]", "[-1, 1, 3]", "[0, 1]", "[1, 1, 1]"),
            (
                M("off_by_one", "return total / len(values)", "return total / (len(values) - 1 or 1)"),
                M("arithmetic", "total += v", "total += v * v"),
            ),
        ),
        Function(
            "sum_range",
            '''def sum_range(start, stop):
    """Sum of the integers from start to stop, both included."""
    total = 0
    for i in range(start, stop + 1):
        total += i
    return total
''',
            ("1, 4", "0, 0", "3, 3", "-2, 2", "5, 4", "2, 6"),
            (
                M("off_by_one", "range(start, stop + 1)", "range(start, stop)"),
                M("off_by_one", "range(start, stop + 1)", "range(start + 1, stop + 1)"),
            ),
        ),
        Function(
            "is_prime",
            '''def is_prime(n):
    """True for prime numbers (2, 3, 5, 7, ...), False otherwise."""
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True
''',
            ("1", "2", "3", "4", "9", "13", "25", "49", "97"),
            (
                M("comparison", "while d * d <= n:", "while d * d < n:"),
                M("constant", "if n < 2:", "if n < 3:"),
            ),
        ),
        Function(
            "percent",
            '''def percent(part, whole, digits=1):
    """part as a percentage of whole, rounded to digits; 0.0 when whole is 0."""
    if whole == 0:
        return 0.0
    return round(100.0 * part / whole, digits)
''',
            ("1, 4", "1, 3", "0, 5", "3, 0", "2, 3, 2", "5, 5"),
            (
                M(
                    "constant",
                    "return round(100.0 * part / whole, digits)",
                    "return round(10.0 * part / whole, digits)",
                ),
                M("wrong_variable", "100.0 * part / whole", "100.0 * whole / part"),
            ),
        ),
    ),
    "text": (
        Function(
            "word_count",
            '''def word_count(text):
    """Number of whitespace-separated words in text."""
    return len(text.split())
''',
            ("'a b c'", "''", "'  spaced   out  '", "'one'", "'tab\\tsep\\nline'"),
            (
                M("wrong_variable", "return len(text.split())", "return len(text.split(' '))"),
                M("off_by_one", "return len(text.split())", "return len(text.split()) - 1 if text else 0"),
            ),
        ),
        Function(
            "truncate",
            '''def truncate(text, width, marker="..."):
    """text cut to at most width characters, ending with marker when it was cut."""
    if len(text) <= width:
        return text
    return text[: width - len(marker)] + marker
''',
            ("'hello world', 8", "'short', 10", "'exactly', 7", "'abcdef', 5, '~'", "'abc', 3"),
            (
                M("comparison", "if len(text) <= width:", "if len(text) < width:"),
                M("off_by_one", "text[: width - len(marker)]", "text[: width - len(marker) + 1]"),
            ),
        ),
        Function(
            "capitalize_words",
            '''def capitalize_words(text):
    """Each word's first letter upper-cased, the rest unchanged; spacing kept."""
    out = []
    start = True
    for ch in text:
        out.append(ch.upper() if start else ch)
        start = ch == " "
    return "".join(out)
''',
            ("'hello world'", "'a'", "''", "'already Fine'", "'two  spaces'", "'mIxEd case'"),
            (
                M("boolean", 'start = ch == " "', 'start = ch != " "'),
                M("constant", "    start = True\n", "    start = False\n"),
            ),
        ),
        Function(
            "is_palindrome",
            '''def is_palindrome(text):
    """True when text reads the same backwards, ignoring case and non-letters."""
    letters = [c.lower() for c in text if c.isalpha()]
    return letters == letters[::-1]
''',
            ("'Racecar'", "'A man, a plan, a canal: Panama'", "'abc'", "''", "'ab'", "'Noon'", "'x'"),
            (
                M(
                    "boolean",
                    "return letters == letters[::-1]",
                    "return len(letters) > 1 and letters == letters[::-1]",
                ),
                M(
                    "wrong_variable",
                    "c.lower() for c in text if c.isalpha()",
                    "c for c in text if c.isalpha()",
                ),
            ),
        ),
        Function(
            "count_vowels",
            '''def count_vowels(text):
    """Number of vowels (a, e, i, o, u; either case) in text."""
    return sum(1 for c in text.lower() if c in "aeiou")
''',
            ("'hello'", "'AEIOU'", "'rhythm'", "''", "'Queue'"),
            (
                M("constant", 'if c in "aeiou"', 'if c in "aeio"'),
                M("wrong_variable", "for c in text.lower()", "for c in text"),
            ),
        ),
    ),
    "seqs": (
        Function(
            "chunk",
            '''def chunk(items, size):
    """items split into consecutive lists of size (the last may be shorter)."""
    return [items[i : i + size] for i in range(0, len(items), size)]
''',
            ("[1, 2, 3, 4, 5], 2", "[], 3", "[1, 2, 3], 3", "[1, 2, 3], 1", "list(range(7)), 3"),
            (
                M("off_by_one", "items[i : i + size]", "items[i : i + size - 1]"),
                M("arithmetic", "range(0, len(items), size)", "range(0, len(items) - 1, size)"),
            ),
        ),
        Function(
            "dedupe",
            '''def dedupe(items):
    """items without repeats, first occurrences kept in order."""
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
''',
            ("[1, 2, 1, 3, 2]", "[]", "['a', 'a', 'a']", "[3, 2, 1]", "[1, 1, 2, 2]"),
            (
                M("boolean", "if item not in seen:", "if item in seen or not seen:"),
                M("wrong_variable", "    return out\n", "    return sorted(out)\n"),
            ),
        ),
        Function(
            "running_max",
            '''def running_max(values):
    """List whose i-th element is the largest of values[0..i]."""
    out = []
    best = None
    for v in values:
        if best is None or v > best:
            best = v
        out.append(best)
    return out
''',
            ("[1, 3, 2, 5, 4]", "[]", "[5, 4, 3]", "[-1, -2, 0]", "[2, 2, 2]"),
            (
                M("comparison", "v > best", "v < best"),
                M("wrong_variable", "out.append(best)", "out.append(v)"),
            ),
        ),
        Function(
            "find_index",
            '''def find_index(items, target):
    """Index of the first item equal to target, or -1."""
    for i, item in enumerate(items):
        if item == target:
            return i
    return -1
''',
            ("[4, 5, 6], 5", "[4, 5, 6], 7", "[], 1", "[1, 1], 1", "['x', 'y'], 'y'"),
            (
                M("constant", "    return -1\n", "    return 0\n"),
                M("off_by_one", "enumerate(items)", "enumerate(items, 1)"),
            ),
        ),
        Function(
            "rotate",
            '''def rotate(items, k):
    """items rotated left by k positions (k may exceed the length)."""
    if not items:
        return []
    k = k % len(items)
    return items[k:] + items[:k]
''',
            ("[1, 2, 3, 4], 1", "[1, 2, 3], 3", "[], 5", "[1, 2, 3], 4", "[1, 2], 0"),
            (
                M("wrong_variable", "return items[k:] + items[:k]", "return items[-k:] + items[:-k]"),
                M("arithmetic", "k = k % len(items)", "k = k % (len(items) + 1)"),
            ),
        ),
    ),
    "dates": (
        Function(
            "is_leap_year",
            '''def is_leap_year(year):
    """Gregorian leap year."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
''',
            ("2024", "2023", "1900", "2000", "2100", "1996"),
            (
                M("boolean", "(year % 100 != 0 or year % 400 == 0)", "(year % 100 != 0 and year % 400 == 0)"),
                M("constant", "year % 400 == 0", "year % 300 == 0"),
            ),
        ),
        Function(
            "days_in_month",
            '''def days_in_month(year, month):
    """Days in a month (1-12) of a Gregorian year."""
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31
''',
            ("2023, 1", "2023, 2", "2024, 2", "2023, 4", "2023, 12", "1900, 2", "2023, 9", "2023, 10"),
            (
                M("constant", "month in (4, 6, 9, 11)", "month in (4, 6, 9, 10)"),
                M("comparison", "if month == 2:", "if month <= 2:"),
            ),
        ),
        Function(
            "to_minutes",
            '''def to_minutes(hhmm):
    """Minutes since midnight of a "HH:MM" string."""
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)
''',
            ("'00:00'", "'01:30'", "'23:59'", "'12:00'", "'00:45'"),
            (
                M("arithmetic", "int(hours) * 60 + int(minutes)", "int(hours) * 60 - int(minutes)"),
                M("constant", "int(hours) * 60", "int(hours) * 100"),
            ),
        ),
        Function(
            "format_duration",
            '''def format_duration(seconds):
    """seconds as "H:MM:SS"."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
''',
            ("0", "59", "60", "3600", "3661", "86399"),
            (
                M("wrong_variable", "minutes, secs = divmod(rest, 60)", "secs, minutes = divmod(rest, 60)"),
                M("constant", "divmod(seconds, 3600)", "divmod(seconds, 3000)"),
            ),
        ),
    ),
}
