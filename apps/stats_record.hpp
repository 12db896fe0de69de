// RunningStats of many cells in an image run's record, one column (array) per field, exact
// (records are stored as CBOR, so every double comes back bit for bit; an empty cell's infinite
// min and max included).
#pragma once

#include "attnscope/analyses/locality.hpp"
#include "attnscope/error.hpp"

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
    record[prefix + "queries"] = count_;
    record[prefix + "mean"] = mean_;
    record[prefix + "m2"] = m2_;
    record[prefix + "min"] = min_;
    record[prefix + "max"] = max_;
  }

  /// Reads the columns written by write(); each must hold n cells (`what` names the record in
  /// the error otherwise).
  static StatsColumns read(const nlohmann::json& record, const std::string& prefix, std::size_t n,
                           const std::string& what) {
    StatsColumns c;
    c.count_ = record.at(prefix + "queries").get<std::vector<std::int64_t>>();
    c.mean_ = record.at(prefix + "mean").get<std::vector<double>>();
    c.m2_ = record.at(prefix + "m2").get<std::vector<double>>();
    c.min_ = record.at(prefix + "min").get<std::vector<double>>();
    c.max_ = record.at(prefix + "max").get<std::vector<double>>();
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
