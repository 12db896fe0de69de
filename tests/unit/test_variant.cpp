// The variant registry: spec grammar, defaults, shorthand, canonical names and errors.
#include "attnscope/error.hpp"
#include "attnscope/variant.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope {
namespace {

TEST(Variant, DefaultsFollowTheHeader) {
  const Variant softmax = parse_variant("softmax");
  EXPECT_EQ(softmax.family, &find_family("softmax"));
  EXPECT_EQ(Variant().name(), "softmax@paper");
  EXPECT_EQ(softmax.convention, Convention::Paper);
  EXPECT_EQ(softmax.name(), "softmax@paper");

  EXPECT_EQ(parse_variant("inline").map.kind, MapKind::Identity);
  EXPECT_EQ(parse_variant("mala").map.kind, MapKind::Elu1);
  EXPECT_EQ(parse_variant("linear:relu").map.kind, MapKind::Relu);
  EXPECT_EQ(parse_variant("mala").name(), "mala:elu1@paper");
  EXPECT_EQ(parse_variant("inline", Convention::Code).name(), "inline:identity@code");
}

TEST(Variant, ConventionShorthandAndExplicit) {
  EXPECT_EQ(parse_variant("mala:code").name(), "mala:elu1@code");
  EXPECT_EQ(parse_variant("inline:paper", Convention::Code).name(), "inline:identity@paper");
  EXPECT_EQ(parse_variant("mala@code").convention, Convention::Code);
  EXPECT_EQ(parse_variant("softmax@code", Convention::Paper).convention, Convention::Code);
  EXPECT_EQ(parse_variant("linear:relu@paper", Convention::Code).convention, Convention::Paper);
  EXPECT_EQ(parse_variant("mala:code@code").convention, Convention::Code);
  EXPECT_THROW((void)parse_variant("mala:code@paper"), UsageError);
}

TEST(Variant, EveryCanonicalNameRoundTrips) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec);
    EXPECT_EQ(v.name(), spec) << spec;
    const Variant again = parse_variant(v.name(), Convention::Code, 99);
    EXPECT_EQ(again.name(), v.name()) << spec;
    EXPECT_EQ(again.family, v.family) << spec;
    EXPECT_EQ(again.map.kind, v.map.kind) << spec;
    EXPECT_EQ(again.map.slope, v.map.slope) << spec;
    if (v.map.kind == MapKind::ReluAffine) {
      EXPECT_EQ(again.map.seed, v.map.seed) << spec;
    }
    EXPECT_EQ(again.convention, v.convention) << spec;
  }
}

TEST(Variant, SeedReachesReluAffine) {
  EXPECT_EQ(parse_variant("linear:relu_affine", Convention::Paper, 42).name(),
            "linear:relu_affine=42@paper");
  EXPECT_EQ(parse_variant("linear:relu_affine=5", Convention::Paper, 42).map.seed, 5u);
}

TEST(Variant, ErrorsAreUsageErrorsThatSayWhy) {
  const auto message = [](const std::string& spec) -> std::string {
    try {
      (void)parse_variant(spec);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message("linear").find("needs a feature map"), std::string::npos);
  EXPECT_NE(message("softmax:relu").find("takes no feature map"), std::string::npos);
  EXPECT_NE(message("softmx").find("softmax, linear, inline, mala"), std::string::npos);
  EXPECT_NE(message("linear:rellu").find("relu"), std::string::npos);
  EXPECT_NE(message("mala@papper").find("paper, code, code+rope"), std::string::npos);
  EXPECT_NE(message("").find("empty"), std::string::npos);
  EXPECT_NE(message("linear:code").find("needs a feature map"), std::string::npos);
}

// code+rope is MALA's released form, the family mala_rope: mala hands the convention over; the
// other families have no such convention and say so.
TEST(Variant, CodeRopeIsTheReleasedMalaFamily) {
  const Variant v = parse_variant("mala@code+rope");
  EXPECT_EQ(v.family, &find_family("mala_rope"));
  EXPECT_EQ(v.convention, Convention::Code);
  EXPECT_EQ(v.name(), "mala_rope:elu1@code");
  EXPECT_TRUE(v.supports());
  EXPECT_FALSE(v.rows_sum_to_one());
  EXPECT_EQ(parse_variant("mala:relu@code+rope").name(), "mala_rope:relu@code");
  EXPECT_TRUE(parse_variant("mala@code").supports());
  const Variant other = parse_variant("inline@code+rope");
  std::string why;
  EXPECT_FALSE(other.supports(&why));
  EXPECT_NE(why.find("code+rope"), std::string::npos) << why;
  EXPECT_NE(why.find("mala"), std::string::npos) << why;
}

TEST(Variant, FeatureFactor) {
  const auto factor = [](const char* spec, double scale, int n) {
    const Variant v = parse_variant(spec);
    return v.kernel()->feature_factor(v, scale, n);
  };
  EXPECT_EQ(factor("inline", 0.125, 197), 1.0);
  EXPECT_DOUBLE_EQ(factor("inline@code", 0.125, 197), std::sqrt(0.125 / 197.0));
  EXPECT_DOUBLE_EQ(factor("mala@code", 0.5, 2), 0.5);
}

TEST(Variant, ListsAndWhitespace) {
  const std::vector<Variant> vs = parse_variants("softmax, linear:relu ,mala:code", Convention::Paper);
  ASSERT_EQ(vs.size(), 3u);
  EXPECT_EQ(vs[0].name(), "softmax@paper");
  EXPECT_EQ(vs[1].name(), "linear:relu@paper");
  EXPECT_EQ(vs[2].name(), "mala:elu1@code");
  EXPECT_THROW((void)parse_variants("softmax,,mala"), UsageError);
}

// Empty lists and empty items are refused alike, and so is one variant named twice, also under
// two spellings: a repeat would give every result row twice.
TEST(Variant, ListsRefuseEmptyItemsAndRepeats) {
  for (const char* spec : {"", " ", ",", "softmax,", ",softmax", "softmax,,mala"}) {
    EXPECT_THROW((void)parse_variants(spec), UsageError) << "'" << spec << "'";
  }
  const std::vector<std::pair<const char*, const char*>> repeats = {
      {"softmax,softmax", "softmax@paper"},
      {"mala,mala:elu1@paper", "mala:elu1@paper"},
      {"inline,linear:relu,inline:identity", "inline:identity@paper"},
      {"mala:code,mala@code", "mala:elu1@code"},
      {"linear:leaky_relu=0.1,linear:leaky_relu=0.10", "linear:leaky_relu=0.1@paper"}};
  for (const auto& [spec, name] : repeats) {
    try {
      (void)parse_variants(spec);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("both are ") + name), std::string::npos)
          << spec << ": " << e.what();
    }
  }
  // The same map under two conventions is two variants.
  EXPECT_EQ(parse_variants("mala@paper,mala@code").size(), 2U);
}

TEST(Variant, FamilyAndConventionNames) {
  ASSERT_GE(all_families().size(), 6U);
  for (const AttentionFamily* f : all_families()) {
    EXPECT_EQ(&find_family(f->name()), f);
    EXPECT_NE(known_families().find(f->name()), std::string::npos);
    EXPECT_FALSE(f->formula().empty()) << f->name();
  }
  for (Convention c : {Convention::Paper, Convention::Code, Convention::CodeRope}) {
    EXPECT_EQ(parse_convention(to_string(c)), c);
  }
  EXPECT_THROW((void)find_family("Softmax"), UsageError);
  EXPECT_THROW((void)parse_convention("Paper"), UsageError);
  EXPECT_TRUE(parse_variant("linear:relu").linear_time_outputs());
  EXPECT_FALSE(parse_variant("softmax").linear_time_outputs());
}

// Each family is of one form and hands out that form only: callers branch on form(), never on the
// family's name.
TEST(Variant, EveryFamilyHandsOutExactlyItsForm) {
  int scores = 0, kernels = 0;
  for (const AttentionFamily* f : all_families()) {
    const bool kernel = f->kernel() != nullptr, score = f->score() != nullptr;
    EXPECT_NE(kernel, score) << f->name() << ": kernel() " << kernel << ", score() " << score;
    EXPECT_EQ(f->form(), kernel ? Form::Kernel : Form::Score) << f->name();
    const Variant v = parse_variant(example_spec(*f), Convention::Code);
    EXPECT_EQ(v.form(), f->form()) << v.name();
    EXPECT_EQ(v.score(), f->score()) << v.name();
    EXPECT_EQ(v.linear_time_outputs(), kernel) << v.name();
    (kernel ? kernels : scores) += 1;
  }
  EXPECT_EQ(find_family("softmax").form(), Form::Score);
  EXPECT_EQ(find_family("linear").form(), Form::Kernel);
  EXPECT_GE(scores, 1);
  EXPECT_GE(kernels, 11);
}

TEST(Variant, RegistryLookUpsWithoutThrowing) {
  for (const AttentionFamily* f : all_families())
    EXPECT_EQ(family_named(f->name()), f) << f->name();
  EXPECT_EQ(family_named("Softmax"), nullptr);  // names are case-sensitive, as find_family's
  EXPECT_EQ(family_named(""), nullptr);
  EXPECT_EQ(family_named("mala@code"), nullptr);  // a spec, not a family name
  for (Convention c : {Convention::Paper, Convention::Code, Convention::CodeRope}) {
    EXPECT_EQ(find_convention(to_string(c)), c);
    EXPECT_NE(convention_names().find(to_string(c)), std::string::npos) << to_string(c);
  }
  EXPECT_FALSE(find_convention("Paper").has_value());
  EXPECT_FALSE(find_convention("code+").has_value());
  EXPECT_EQ(convention_names(), "paper, code or code+rope");
}

}  // namespace
}  // namespace attnscope
