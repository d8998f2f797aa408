# train_corpus.sh -- sourced by test_train.sh and test_gpu_train.sh. `train_corpus FILE` writes a
# corpus with structure to learn: 3000 words of 2-4 consonant-vowel syllables, from a Park-Miller
# generator (exact in awk's doubles, so every awk gives the same words), plus lines the loader
# must skip (capitals, digits, apostrophes). Without a usable awk it takes the first 3000 words
# of the system word list; returns 1 when it has neither.
train_corpus() {
  awk 'BEGIN {
    s = 12345; split("b d f g k l m n p r s t v z", c, " "); split("a e i o u", v, " ")
    for (w = 0; w < 3000; w++) {
      s = (s * 16807) % 2147483647; ns = 2 + s % 3; word = ""
      for (k = 0; k < ns; k++) {
        s = (s * 16807) % 2147483647; word = word c[1 + s % 14]
        s = (s * 16807) % 2147483647; word = word v[1 + s % 5]
      }
      print word
    }
    print "Capital"; print "it'"'"'s"; print "abc123"
  }' > "$1" 2>/dev/null
  [ "$(wc -l < "$1")" -eq 3003 ] && return 0
  if [ -r /usr/share/dict/words ]; then
    grep -x '[a-z]*' /usr/share/dict/words | head -n 3000 > "$1"
    return 0
  fi
  return 1
}
