"""One folder per paper. A paper imports the core and the language-model machinery, never another paper."""
