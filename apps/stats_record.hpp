// RunningStats of many cells in an image run's record, one column per field, exact (each column
// a byte string of its values, run/record_arrays.hpp: every double comes back bit for bit, an
// empty cell's infinite min and max included).
#pragma once

#include "attnscope/analyses/locality.hpp"
#include "attnscope/error.hpp"
#include "attnscope/run/record_arrays.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace attnscope::app {

class StatsColumns {
 public:
  void push(const analyses::RunningStats& s) {
    count_.push_back(s.count);
    mean_.push_back(s.mean);
    m2_.push_back(s.m2);
    min_.push_back(s.min);
    max_.push_back(s.max);
  }

  /// Adds the columns to `record` as PREFIX + queries, mean, m2, min, max.
  void write(nlohmann::json& record, const std::string& prefix) const {
    record[prefix + "queries"] = run::packed_array(count_);
    record[prefix + "mean"] = run::packed_array(mean_);
    record[prefix + "m2"] = run::packed_array(m2_);
    record[prefix + "min"] = run::packed_array(min_);
    record[prefix + "max"] = run::packed_array(max_);
  }

  /// Reads the columns written by write(); each must hold n cells (`what` names the record in
  /// the error otherwise).
  static StatsColumns read(const nlohmann::json& record, const std::string& prefix, std::size_t n,
                           const std::string& what) {
    StatsColumns c;
    c.count_ = run::unpacked_int64s(record.at(prefix + "queries"), what);
    c.mean_ = run::unpacked_doubles(record.at(prefix + "mean"), what);
    c.m2_ = run::unpacked_doubles(record.at(prefix + "m2"), what);
    c.min_ = run::unpacked_doubles(record.at(prefix + "min"), what);
    c.max_ = run::unpacked_doubles(record.at(prefix + "max"), what);
    for (std::size_t size : {c.count_.size(), c.mean_.size(), c.m2_.size(), c.min_.size(),
                             c.max_.size()}) {
      if (size != n) throw Error(what + ": a malformed record");
    }
    return c;
  }

  [[nodiscard]] analyses::RunningStats at(std::size_t i) const {
    analyses::RunningStats s;
    s.count = count_[i];
    s.mean = mean_[i];
    s.m2 = m2_[i];
    s.min = min_[i];
    s.max = max_[i];
    return s;
  }

 private:
  std::vector<std::int64_t> count_;
  std::vector<double> mean_, m2_, min_, max_;
};

}  // namespace attnscope::app
