#include "attnscope/run/exit_status.hpp"

#include <new>

namespace attnscope::run {

ExitStatus exit_status(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const CodedExit& x) {
    return {x.code(), x.what()};
  } catch (const UsageError& x) {
    return {kExitUsage, x.what()};
  } catch (const NothingToMeasure& x) {
    return {kExitNothingToMeasure, x.what()};
  } catch (const std::bad_alloc&) {
    return {kExitInput, "out of memory"};
  } catch (const std::exception& x) {
    return {kExitInput, x.what()};
  } catch (...) {
    return {kExitInput, "unknown error"};
  }
}

}  // namespace attnscope::run
