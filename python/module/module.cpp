// _attnscope: the library on arrays, for the pure-Python package attnscope (python/attnscope/).
// The library's errors become Python exceptions with the message the command line prints:
// bad input (InputError), a bad name or parameter (UsageError) and a computation without a finite
// answer (NumericalError) raise ValueError; any other attnscope error raises RuntimeError. A
// dtype that is not float16/32/64 raises TypeError (arrays.cpp).
#include "bindings.hpp"

#include "attnscope/error.hpp"

#include <pybind11/pybind11.h>

PYBIND11_MODULE(_attnscope, m) {
  m.doc() = "attnscope's C++ library on numpy arrays (use the package attnscope, not this module)";
  m.attr("__version__") = ATTNSCOPE_VERSION;
  m.attr("arch") = ATTNSCOPE_ARCH;
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attnscope::InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const attnscope::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const attnscope::NumericalError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const attnscope::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  attnscope::python::bind_attention(m);
  attnscope::python::bind_analyses(m);
  attnscope::python::bind_query_stats(m);
  attnscope::python::bind_live(m);
  attnscope::python::bind_diagnostics(m);
}
