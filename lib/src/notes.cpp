// Held notes (notes.hpp).
#include "attnscope/notes.hpp"

#include <iostream>
#include <mutex>
#include <utility>
#include <vector>

namespace attnscope {
namespace {

struct Held {
  std::mutex mutex;
  std::vector<std::string> lines;
};

Held& held() {
  static Held h;
  return h;
}

}  // namespace

void hold_note(std::string line) {
  Held& h = held();
  const std::lock_guard<std::mutex> lock(h.mutex);
  h.lines.push_back(std::move(line));
}

void release_notes() {
  Held& h = held();
  const std::lock_guard<std::mutex> lock(h.mutex);
  if (h.lines.empty()) return;  // the common case: once per image of every run
  for (const std::string& line : h.lines) std::cerr << line << "\n";
  std::cerr << std::flush;
  h.lines.clear();
}

void drop_notes() {
  Held& h = held();
  const std::lock_guard<std::mutex> lock(h.mutex);
  h.lines.clear();
}

}  // namespace attnscope
