/*
** fuzz_recipe.c -- libFuzzer target: the recipe parser (hq_recipe_load_string) on arbitrary
** text, against the stock plugins ($HQ_PLUGIN_PATH, loaded once and shared through
** hq_recipe_opts.plugins, so that inputs are not spent in dlopen); a loaded recipe is also asked
** for its quantizers (scripts/fuzz.sh).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hq/hq.h"

static hq_plugins *g_set;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_set && hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &g_set)) abort();
  hq_recipe_opts opts = {.struct_size = sizeof opts, .plugins = g_set};
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  hq_recipe *r = NULL;
  int rc = hq_recipe_load_string(text, "fuzz.ini", &opts, &r);
  if (rc && (r || !hq_last_error()[0])) abort(); /* a refusal frees and says why */
  if (!rc) {
    const hq_role roles[] = {hq_role_of("linear", "weight", "fc1"),
                             hq_role_of("linear", "input", "fc1"),
                             hq_role_of("linear", "grad_output", "lm_head")};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
      hq_quantizer *q = NULL;
      if (hq_quantizer_create(r, &roles[i], &q) == HQ_OK) hq_quantizer_free(q);
    }
    hq_recipe_free(r);
  }
  free(text);
  return 0;
}
