#include "attnscope/error.hpp"

#include <utility>

namespace attnscope {

namespace {

std::string input_message(const std::string& file, const std::string& object,
                          const std::string& expected, const std::string& found) {
  std::string m = file.empty() ? std::string("<input>") : file;
  if (!object.empty()) m += ": " + object;
  m += ": expected " + expected + ", found " + found;
  return m;
}

}  // namespace

InputError::InputError(std::string file, std::string object, std::string expected,
                       std::string found)
    : Error(input_message(file, object, expected, found)),
      file_(std::move(file)),
      object_(std::move(object)) {}

}  // namespace attnscope
