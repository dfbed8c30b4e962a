// The entries list on a phone (issue 26.5): the secondary filters fold away unless one of them
// is set, so the first entry shows above the fold. Without JavaScript they stay open.
(function () {
  "use strict";
  var fold = document.querySelector("details[data-fold-narrow]");
  if (!fold || fold.hasAttribute("data-active")) return;
  if (window.matchMedia("(max-width: 760px)").matches) fold.open = false;
})();
