// Errors that name the place: file, dataset (or other object), what was expected and what was found.
#pragma once

#include <stdexcept>
#include <string>

namespace attnscope {

/// Base of every error attnscope throws on purpose. what() is one line, fit for stderr.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input data: a file that is missing, not HDF5, malformed, or holds NaN/Inf.
class InputError : public Error {
 public:
  InputError(std::string file, std::string object, std::string expected, std::string found);
  const std::string& file() const { return file_; }
  const std::string& object() const { return object_; }

 private:
  std::string file_, object_;
};

/// A user-supplied name or parameter that does not parse (variant spec, flag value, ...).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// A computation that cannot give a finite answer (e.g. exp feature map overflow).
class NumericalError : public Error {
 public:
  using Error::Error;
};

}  // namespace attnscope
