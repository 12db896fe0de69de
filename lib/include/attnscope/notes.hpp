// Notes for the user (one line each on stderr), held until the run has shown that it goes ahead:
// its first image computed, or the command done. A run refused on its input then prints its one
// error line and nothing else (docs/reliability.md).
#pragma once

#include <string>

namespace attnscope {

/// Holds `line` (the whole line, e.g. "attnscope confusion: note: ...", without the newline);
/// thread-safe.
void hold_note(std::string line);

/// Prints the held notes on stderr, in the order they came, and forgets them.
void release_notes();

/// Forgets the held notes unprinted (the run failed: its error line says what matters).
void drop_notes();

}  // namespace attnscope
