#include "attnscope/run/result_files.hpp"

#include <cmath>
#include <iomanip>

namespace attnscope::run {

void write_locality_files(ResultSet& set, const analyses::LocalityResult& r) {
  ResultFile f(set, "locality.csv");
  f.stream() << "variant,layer,head,window,mean,std,min,max,queries,uniform_baseline\n"
             << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (const auto& h : r.per_head[v]) {
      const bool any = h.mass.count > 0;
      f.stream() << r.variants[v].name() << "," << h.layer << "," << h.head << "," << r.window
                 << "," << (any ? h.mass.mean : 0.0) << "," << h.mass.stddev() << ","
                 << (any ? h.mass.min : 0.0) << "," << (any ? h.mass.max : 0.0) << ","
                 << h.mass.count << "," << r.uniform_baseline << "\n";
    }
  }
  f.close();
}

std::vector<analyses::CensusCell> write_census_files(
    ResultSet& set, const std::vector<Variant>& variants,
    const std::vector<analyses::CensusCell>& cells) {
  ResultFile f(set, "census.csv");
  f.stream() << "variant,layer,head,weights,negative,zero,most_negative,rows_not_summing_to_one,"
                "max_row_sum_error\n"
             << std::setprecision(17);
  for (const auto& c : cells) {
    f.stream() << c.variant << "," << c.layer << "," << c.head << "," << c.weights << ","
               << c.negative << "," << c.zero << "," << c.most_negative << ","
               << c.rows_not_summing_to_one << "," << c.max_row_sum_error << "\n";
  }
  f.close();
  std::vector<analyses::CensusCell> out;
  for (const Variant& v : variants) {
    analyses::CensusCell t;
    t.variant = v.name();
    t.layer = t.head = -1;
    for (const auto& c : cells) {
      if (c.variant == t.variant) t.merge(c);
    }
    out.push_back(t);
  }
  return out;
}

nlohmann::json census_totals_json(const std::vector<analyses::CensusCell>& totals) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : totals) {
    out.push_back(
        {{"variant", t.variant},
         {"rows", t.rows},
         {"weights", t.weights},
         {"negative", t.negative},
         {"zero", t.zero},
         {"most_negative",
          std::isfinite(t.most_negative) ? nlohmann::json(t.most_negative) : nlohmann::json()},
         {"rows_not_summing_to_one", t.rows_not_summing_to_one},
         {"max_row_sum_error", t.max_row_sum_error},
         {"degenerate_rows", t.degenerate_rows}});
  }
  return out;
}

}  // namespace attnscope::run
